"""Where along a draft the demo's drafters lose: generations (greedy by default) from the held-out test prompts
(the `evaluate` stage's, training/prompts.py) on the CPU, and per drafter τ, τ by where in the continuation a step
starts, the histogram of accepted drafts a step and the conditional acceptance P(draft j+1 accepted | the first j
were).
Usage (one core is enough; about 30 s at the evaluation's 4 prompts a category):
    python benchmarks/demo_acceptance.py [name=folder ...] [--data ROOT] [--per-category N] [--half select] [-t T]
        [--seeds N]
Each folder's config.json tells its kind (DFlash, DFlash 2, EAGLE-3); by default the shipped DFlash 2 (the demo's
block drafter with its selector) and EAGLE-3; `dflash=FOLDER` runs a DFlash 2 folder's block drafter alone. ROOT:
the Python source the held-out prompts come from (this interpreter's standard library by default). Compare recipe
variants on `--half select` (the prompts that choose the block size) and measure only the winner on the test half."""

import argparse
import collections
import os
import sys
import sysconfig
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.runtime.drafters import detect_kind, load  # noqa: E402
from dflash_cli.runtime.generation import Request, generate  # noqa: E402
from dflash_cli.runtime import sampling  # noqa: E402
from dflash_cli.runtime.sampling import SamplingParams  # noqa: E402
from dflash_cli.runtime.session import Session  # noqa: E402
from dflash_cli.runtime.speculative import SpeculativeDecoder  # noqa: E402
from dflash_cli.training import corpus, presets, prompts  # noqa: E402
from dflash_cli.training.evaluate import EVAL_PROMPT, THREADS  # noqa: E402
from dflash_cli.training.pipeline import _load_target  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "dflash_cli" / "demo"

ap = argparse.ArgumentParser()
ap.add_argument("drafters", nargs="*", help="name=folder")
ap.add_argument("--data", default=sysconfig.get_paths()["stdlib"])
ap.add_argument("--per-category", type=int, default=presets.DEMO.eval_prompts, help="prompts a category")
ap.add_argument("-t", "--temperature", type=float, default=0.0, help="sampled at T, seeded per prompt")
ap.add_argument("--seeds", type=int, default=1, help="sampled: generations a prompt (seeds i, i + 1000, ...)")
ap.add_argument("--half", choices=("test", "select"), default="test", help="which half of the held-out files")
args = ap.parse_args()
drafters = dict(a.split("=", 1) for a in args.drafters) or {"dflash2": DEMO / "dflash2", "eagle3": DEMO / "eagle3"}

from tokenizers import Tokenizer  # noqa: E402

torch.set_num_threads(THREADS)
p = presets.DEMO
tok = Tokenizer.from_file(str(DEMO / "target" / "tokenizer.json"))
eos = tok.token_to_id(corpus.SEPARATOR)
data = corpus.collect([Path(args.data)], p.max_corpus_bytes)
half = prompts.TEST if args.half == "test" else prompts.SELECT
test = prompts.category_prompts(data.held_out, tok, args.per_category, EVAL_PROMPT, half)
target = _load_target(DEMO / "target", torch.device("cpu"))
print(f"{len(test)} held-out {args.half} prompts from {args.data}, {p.eval_tokens} tokens each at T "
      f"{args.temperature}" + (f", {args.seeds} seeds a prompt" if args.temperature and args.seeds > 1 else ""))


TOTALS = [0, 0.0, 0.0]  # sampled verify steps, their expected accepted drafts: block verification, token by token


def count_expected() -> None:
    """Sampled: wrap the verify's acceptance to add up in TOTALS, on each step's own drafts and rows, the expected
    accepted drafts of block verification (the engine's) and of token-by-token rejection sampling. Both on the same
    draws, so their difference is free of the texts' sampling noise."""
    accept = sampling.accept

    def counted(drafts, q, p, vocab, gen):
        k = drafts.shape[0]
        if k:
            h, _ = sampling.block_weights(drafts, q, p, vocab)
            at = drafts[:, None]
            later = torch.flip(torch.cumprod(torch.flip(1 - h.double(), [0]), 0), [0])  # P(n < i) = prod(1 - h_j)
            ratio = p[:k].at(at, vocab).double()[:, 0] / q[:k].at(at, vocab).double()[:, 0]
            TOTALS[0] += 1
            TOTALS[1] += float((1 - later).sum())  # sum_i P(n >= i)
            TOTALS[2] += float(ratio.clamp(max=1).cumprod(0).sum())
        return accept(drafts, q, p, vocab, gen)

    sampling.accept = counted


if args.temperature:
    count_expected()
SPANS = (0, 16, 48)  # where in the continuation a step starts: the first tokens after the prompt are the hardest
for name, folder in drafters.items():
    kind = detect_kind(Path(folder), name)  # dflash=FOLDER of a DFlash 2 folder: its block drafter alone
    decoder = SpeculativeDecoder(load(kind, Path(folder), target), p.draft_len if kind == "eagle3" else None)
    session = Session(target, EVAL_PROMPT + p.eval_tokens + 32)
    hist = collections.Counter()
    by_span = collections.defaultdict(lambda: [0, 0])  # span start -> [steps, tokens]
    by_seed = collections.defaultdict(lambda: [0, 0])  # seed round -> [steps, tokens]
    TOTALS[:] = [0, 0.0, 0.0]
    runs = [(i + 1000 * r, r, ids) for r in range(args.seeds if args.temperature else 1)
            for i, (_, ids) in enumerate(test)]
    for seed, round_, ids in runs:
        session.reset()
        params = SamplingParams(temperature=args.temperature, seed=seed)
        res = generate(session, decoder, Request(ids, params, p.eval_tokens, (eos,)))
        hist.update(s.accepted for s in res.steps)
        done = 0
        for s in res.steps:  # τ as `evaluate` counts it: cut at the budget and stops
            span = by_span[max(x for x in SPANS if x <= done)]
            span[0] += 1
            span[1] += len(s.emitted)
            done += len(s.emitted)
        by_seed[round_][0] += len(res.steps)
        by_seed[round_][1] += done
    steps = sum(hist.values())
    tau = sum(t for _, t in by_span.values()) / steps
    reach = [sum(v for k, v in hist.items() if k >= j) for j in range(max(hist) + 2)]
    cond = " ".join(f"{reach[j + 1] / reach[j]:.2f}" for j in range(max(hist)) if reach[j])
    print(f"{name}: τ {tau:.2f} over {steps} steps; P(draft j+1 | j) for j = 0..: {cond}")
    ends = [*SPANS[1:], p.eval_tokens]
    print("  τ of the steps starting at tokens " + ", ".join(
        f"{a}-{b - 1}: {by_span[a][1] / by_span[a][0]:.2f}" for a, b in zip(SPANS, ends) if by_span[a][0]))
    print(f"  accepted drafts a step: {' '.join(f'{k}:{v}' for k, v in sorted(hist.items()))}")
    if len(by_seed) > 1:
        print("  τ by seed round: " + ", ".join(f"{t / n:.2f}" for n, t in by_seed.values()))
    if TOTALS[0]:
        print(f"  expected accepted drafts a step on the same draws: block verification {TOTALS[1] / TOTALS[0]:.3f}, "
              f"token by token {TOTALS[2] / TOTALS[0]:.3f}")
