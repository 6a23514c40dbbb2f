"""τ at temperature > 0 on the embedded demo pair: drafts sampled from the drafter's own filtered distribution
(q its probabilities, what the engine ships) against drafts proposed as the drafter's argmax (q one-hot).

τ = committed tokens per verify step (accepted drafts + 1), pooled over prompts and seeds. Both ways are
lossless (runtime/sampling.py accept_sampled: with a one-hot q it accepts with probability p(draft) and at a
rejection draws from p with the draft removed); they differ only in how much is accepted. DFlash's block
positions are drafted in one forward, not conditioned on each other, so sampling each from its row may draw
an incoherent block; EAGLE-3's chain conditions each position on the one sampled before it.

Prompts: the demo's held-out files (dflash_cli/training/corpus.py: a hash of the relative path decides, so
the same names are held out of this machine's standard library), tokenised into one stream like the
training's, and EVAL_PROMPT-token windows spread evenly over it (training/evaluate.py held_out_prompts).
The stdlib here may be another Python version than the demo's (3.12): the names are the demo's held-out
ones, the text may differ slightly.

    PYTHONPATH=$PWD python benchmarks/sampled_acceptance.py [--prompts 4] [--seeds 3] [--tokens 96]

CPU, one thread: about 4 minutes with the defaults (4 prompts x 3 seeds), 8 to 11 with --prompts 8.
Both ways of both drafters are defined here (the sampled ones as the engine's proposers have them, the argmax
ones with a materialised one-hot q), so the comparison runs whatever the engine ships.

Result (2026-11-26, CPU, --prompts 8 --seeds 3 --tokens 96: 24 generations a cell; ± standard error over them;
α1 = the first draft's expected acceptance, both ways, on the same contexts):

| T | top-p / top-k | drafter | sampled τ | argmax τ | argmax / sampled | α1 sampled | α1 argmax |
|---|---|---|---|---|---|---|---|
| 0.6 | 1 / off | dflash | 1.496 ± 0.120 | 1.400 ± 0.103 | 0.94 | 0.294 | 0.282 |
| 0.6 | 1 / off | eagle3 | 2.692 ± 0.223 | 2.386 ± 0.181 | 0.89 | 0.582 | 0.548 |
| 0.6 | 0.95 / 20 | dflash | 1.497 ± 0.101 | 1.462 ± 0.075 | 0.98 | 0.306 | 0.302 |
| 0.6 | 0.95 / 20 | eagle3 | 2.988 ± 0.183 | 2.804 ± 0.188 | 0.94 | 0.636 | 0.618 |
| 1.0 | 1 / off | dflash | 1.307 ± 0.030 | 1.202 ± 0.044 | 0.92 | 0.237 | 0.165 |
| 1.0 | 1 / off | eagle3 | 1.718 ± 0.066 | 1.508 ± 0.067 | 0.88 | 0.382 | 0.272 |
| 1.0 | 0.95 / 20 | dflash | 1.340 ± 0.034 | 1.317 ± 0.049 | 0.98 | 0.257 | 0.232 |
| 1.0 | 0.95 / 20 | eagle3 | 1.949 ± 0.156 | 1.770 ± 0.068 | 0.91 | 0.453 | 0.383 |

Sampled drafts accepted more in every cell, for both drafters (mean τ DFlash 1.410 vs 1.345, EAGLE-3 2.337 vs
2.117), and so did the first draft on identical contexts (α1): the engine keeps sampled drafts for both. This is
the demo pair, whose DFlash drafter is weak (greedy τ 1.8 over 16-token blocks): with a strong block drafter
the argmax block's coherence may count for more; rerun this on such a pair before concluding for it. On the GPU
the argmax EAGLE-3 chain is one graph and queues ahead, the sampled chain is eager (24 ms a step on the H100):
there tokens/s, not τ, decides, which this CPU benchmark does not measure.
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from dflash_cli.runtime.generation import Request, generate
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime import sampling
from dflash_cli.runtime.sampling import SamplingParams, probabilities
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.eagle3 import Eagle3Drafter
from dflash_cli.models.qwen3 import Qwen3Model
from dflash_cli.registry import Registry
from dflash_cli.training.corpus import MAX_FILE_BYTES, SEPARATOR, _is_held_out
from dflash_cli.training.evaluate import EVAL_PROMPT, held_out_prompts

DEMO_STDLIB = "python3.12"  # the root name of the demo's training data (training_info.json: data.roots)


def _onehot(drafts: torch.Tensor, vocab: int, params: SamplingParams):
    """(drafts, q) for drafts that are certain, q written where the verify's acceptance reads it: that then accepts
    with probability p(draft) and, at a rejection, draws from p with the draft removed (max(p - onehot, 0))."""
    rows = sampling.Filtered(drafts.view(-1, 1), torch.ones(drafts.shape[0], 1, device=drafts.device))
    return drafts, sampling.sampler(drafts.device).write_q(sampling.mode(params), vocab, rows)


# The sampled way is the engine's own; the argmax way is defined here, so that the comparison stays runnable.


SampledDFlash = DFlashProposer  # what the engine ships: each block position drawn from its own filtered row


class ArgmaxDFlash(DFlashProposer):
    """The block's argmax; q one-hot."""

    def propose(self, last, k, params):
        return _onehot(DFlashProposer.propose(self, last, k, SamplingParams())[0], self.model.cfg.vocab_size,
                       params)

    def propose_ahead(self, hidden, ids, start, accepted, bonus, k, params):
        drafts = DFlashProposer.propose_ahead(self, hidden, ids, start, accepted, bonus, k, SamplingParams())[0]
        return _onehot(drafts, self.model.cfg.vocab_size, params)


SampledEagle3 = Eagle3Proposer  # what the engine ships: the chain that samples each position (one graph)


class ArgmaxEagle3(Eagle3Proposer):
    """The greedy chain (on the GPU one graph, and queued ahead); q one-hot."""

    def can_queue_ahead(self, params):
        return self.fast is not None

    def propose(self, last, k, params):
        return _onehot(self.greedy_chain(last, k), self.model.c.vocab, params)

    def propose_ahead(self, hidden, ids, start, accepted, bonus, k, params):
        drafts = Eagle3Proposer.propose_ahead(self, hidden, ids, start, accepted, bonus, k, SamplingParams())[0]
        return _onehot(drafts, self.model.c.vocab, params)


WAYS = {("dflash", "argmax"): ArgmaxDFlash, ("dflash", "sampled"): SampledDFlash,
        ("eagle3", "argmax"): ArgmaxEagle3, ("eagle3", "sampled"): SampledEagle3}


class Probe(SpeculativeDecoder):
    """On each verify, the exact expected acceptance of the first draft both ways, on this same context:
    sampled sum(min(p, q)) and argmax p(argmax q) (q's argmax is the drafter's). Noise-free given the contexts."""

    def __init__(self, proposer, draft_len, record: bool):
        super().__init__(proposer, draft_len)
        self.record = record  # on the sampled way, where q is the drafter's own rows
        self.first = []  # (sampled, argmax) per step

    def accept(self, ids, q, out, params):
        if self.record and q.ids.shape[0]:
            p = probabilities(out.logits[:1], params)[0]
            q0 = q[:1].dense(p.shape[-1])[0]
            self.first.append((float(torch.minimum(p, q0).sum()), float(p[q0.argmax()])))
        return super().accept(ids, q, out, params)


def held_out_stream(tok: Tokenizer, max_files: int) -> tuple[torch.Tensor, int]:
    """The demo's held-out file names, read from this machine's stdlib, in the training's sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.rglob("*.py")):
        rel_parts = path.relative_to(root).parts
        if "site-packages" in rel_parts or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        if not _is_held_out(f"{DEMO_STDLIB}/{path.relative_to(root).as_posix()}", 0.02):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip() and SEPARATOR not in text:
            texts.append(text)
        if len(texts) >= max_files:
            break
    sep = tok.token_to_id(SEPARATOR)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids + [sep])
    return torch.tensor(ids), len(texts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--files", type=int, default=72, help="held-out files read (the demo held out 72)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    demo = Registry.load().entries["demo"]
    tpath = demo.target.path()
    target = Qwen3Model.load(tpath)
    drafters = {"dflash": DFlashDrafter.load(demo.drafters["dflash"].path(), target),
                "eagle3": Eagle3Drafter.load(demo.drafters["eagle3"].path(), target)}
    draft_len = {"dflash": None, "eagle3": demo.draft_len}  # as the CLI: DFlash's block, the entry's chain length
    tok = Tokenizer.from_file(str(tpath / "tokenizer.json"))
    stream, files = held_out_stream(tok, args.files)
    prompts = held_out_prompts(stream, args.prompts, EVAL_PROMPT)
    eos = tok.token_to_id(SEPARATOR)
    print(f"{len(prompts)} prompts of {EVAL_PROMPT} tokens from {files} held-out stdlib files ({stream.numel()} "
          f"tokens), seeds 0..{args.seeds - 1}, {args.tokens} tokens each, stop at {SEPARATOR}")

    settings = [("0.6", SamplingParams(0.6)), ("0.6 p0.95 k20", SamplingParams(0.6, 0.95, 20)),
                ("1.0", SamplingParams(1.0)), ("1.0 p0.95 k20", SamplingParams(1.0, 0.95, 20))]
    session = Session(target, EVAL_PROMPT + args.tokens + 32)
    rows = []
    t_start = time.perf_counter()
    for label, base in settings:
        for kind in ("dflash", "eagle3"):
            res = {}
            for way in ("sampled", "argmax"):
                decoder = Probe(WAYS[kind, way](drafters[kind]), draft_len[kind], record=way == "sampled")
                steps = committed = 0
                per_gen = []  # τ of each generation
                t0 = time.perf_counter()
                for seed in range(args.seeds):
                    params = SamplingParams(base.temperature, base.top_p, base.top_k, seed=seed)
                    for ids in prompts:
                        session.reset()
                        r = generate(session, decoder, Request(ids, params, args.tokens, (eos,)))
                        c = sum(len(s.emitted) for s in r.steps)
                        steps += len(r.steps)
                        committed += c
                        per_gen.append(c / max(len(r.steps), 1))
                g = torch.tensor(per_gen, dtype=torch.float64)
                se = float(g.std() / len(g) ** 0.5) if len(g) > 1 else float("nan")
                res[way] = dict(tau=committed / max(steps, 1), se=se, tokens=committed, steps=steps,
                                seconds=time.perf_counter() - t0, first=decoder.first)
            first = torch.tensor(res["sampled"]["first"], dtype=torch.float64).mean(0).tolist()
            rows.append((label, kind, res, first))
            s, a = res["sampled"], res["argmax"]
            print(f"T {label:<13} {kind:<7} sampled τ {s['tau']:.3f} ± {s['se']:.3f} ({s['tokens']} tokens / "
                  f"{s['steps']} steps)   argmax τ {a['tau']:.3f} ± {a['se']:.3f} ({a['tokens']} / {a['steps']})   "
                  f"first draft on the same contexts: sampled {first[0]:.3f} argmax {first[1]:.3f}   "
                  f"{s['seconds'] + a['seconds']:.0f} s", flush=True)

    n = len(prompts) * args.seeds
    print(f"\n{len(prompts)} prompts x {args.seeds} seeds = {n} generations of up to {args.tokens} tokens per cell "
          f"({time.perf_counter() - t_start:.0f} s). τ: committed tokens per verify step, pooled; ± the standard "
          f"error over the generations. α1: the first draft's expected acceptance on the sampled runs' contexts.")
    print("\n| T | top-p / top-k | drafter | sampled τ | argmax τ | argmax / sampled | α1 sampled | α1 argmax |")
    print("|---|---|---|---|---|---|---|---|")
    for label, kind, res, first in rows:
        s, a = res["sampled"], res["argmax"]
        print(f"| {label.split()[0]} | {'0.95 / 20' if 'k20' in label else '1 / off'} | {kind} | "
              f"{s['tau']:.3f} ± {s['se']:.3f} | {a['tau']:.3f} ± {a['se']:.3f} | {a['tau'] / s['tau']:.2f} | "
              f"{first[0]:.3f} | {first[1]:.3f} |")
    for kind in ("dflash", "eagle3"):
        s = [r["sampled"]["tau"] for _, k, r, _ in rows if k == kind]
        a = [r["argmax"]["tau"] for _, k, r, _ in rows if k == kind]
        print(f"| mean | | {kind} | {sum(s) / len(s):.3f} | {sum(a) / len(a):.3f} | {sum(a) / sum(s):.2f} | | |")


if __name__ == "__main__":
    main()
