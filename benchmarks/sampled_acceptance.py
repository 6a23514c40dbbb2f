"""τ at temperature > 0 on the embedded demo pair: drafts proposed as the drafter's argmax (q one-hot, what
the engine ships) against drafts sampled from the drafter's own filtered distribution (q its probabilities).

τ = committed tokens per verify step (accepted drafts + 1), pooled over prompts and seeds. Both ways are
lossless (engine/sampling.py accept_sampled); they differ only in how much is accepted. DFlash's block
positions are drafted in one forward, not conditioned on each other, so sampling each from its row draws
an incoherent block; EAGLE-3's chain does condition each position on the one sampled before it.

Prompts: the demo's held-out files (dflash_cli/training/corpus.py: a hash of the relative path decides, so
the same names are held out of this machine's standard library), tokenised into one stream like the
training's, and EVAL_PROMPT-token windows spread evenly over it (training/evaluate.py held_out_prompts).
The stdlib here may be another Python version than the demo's (3.12): the names are the demo's held-out
ones, the text may differ slightly.

    PYTHONPATH=$PWD python benchmarks/sampled_acceptance.py [--prompts 4] [--seeds 3] [--tokens 96]

CPU, one thread: a few minutes. The sampled ways are defined here only (they lost, see the table in the
commit that added this script); the argmax ways are the engine's own proposers.
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from dflash_cli.engine.generation import Request, generate
from dflash_cli.engine.proposers.dflash import DFlashProposer
from dflash_cli.engine.proposers.eagle3 import Eagle3Proposer
from dflash_cli.engine.sampling import SamplingParams, draw, probabilities
from dflash_cli.engine.session import Session
from dflash_cli.engine.speculative import SpeculativeDecoder
from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.eagle3 import Eagle3Drafter
from dflash_cli.models.qwen3 import Qwen3Model
from dflash_cli.registry import Registry
from dflash_cli.training.corpus import MAX_FILE_BYTES, SEPARATOR, _is_held_out
from dflash_cli.training.evaluate import EVAL_PROMPT, held_out_prompts

DEMO_STDLIB = "python3.12"  # the root name of the demo's training data (training_info.json: data.roots)


class SampledDFlash(DFlashProposer):
    """Each block position drawn from its own filtered row; q = those rows."""

    @staticmethod
    def _drafts(logits, params, gen):
        q = probabilities(logits, params)
        return draw(q, gen), q


class SampledEagle3(Eagle3Proposer):
    """The eager chain that samples each position and feeds it to the next; q = the filtered rows, zero
    outside the draft vocabulary."""

    def queues_ahead(self, params):
        return False  # the device-position chain is greedy

    def propose(self, last, k, params, gen):
        d = self.drafter
        pos, state = d.first_state()
        token, drafts, rows = last, [], []
        for _ in range(k):
            logits, state = d.chain_step(pos, state, token)
            q = logits.new_zeros(d.c.vocab)
            q[d.draft_to_target] = probabilities(logits, params)
            rows.append(q)
            token = draw(q, gen).view(1)
            drafts.append(token)
            pos += 1
        return torch.cat(drafts), torch.stack(rows)


WAYS = {("dflash", "argmax"): DFlashProposer, ("dflash", "sampled"): SampledDFlash,
        ("eagle3", "argmax"): Eagle3Proposer, ("eagle3", "sampled"): SampledEagle3}


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

    settings = [("0.6", SamplingParams(0.6)), ("0.6 p.95 k20", SamplingParams(0.6, 0.95, 20)),
                ("1.0", SamplingParams(1.0)), ("1.0 p.95 k20", SamplingParams(1.0, 0.95, 20))]
    session = Session(target, EVAL_PROMPT + args.tokens + 32)
    rows = []
    t_start = time.perf_counter()
    for label, base in settings:
        for kind in ("dflash", "eagle3"):
            res = {}
            for way in ("sampled", "argmax"):
                decoder = SpeculativeDecoder(WAYS[kind, way](drafters[kind]), draft_len[kind])
                steps = committed = drafted = 0
                t0 = time.perf_counter()
                for seed in range(args.seeds):
                    params = SamplingParams(base.temperature, base.top_p, base.top_k, seed=seed)
                    for ids in prompts:
                        session.reset()
                        r = generate(session, decoder, Request(ids, params, args.tokens, (eos,)))
                        steps += len(r.steps)
                        committed += sum(len(s.emitted) for s in r.steps)
                        drafted += sum(len(s.draft) for s in r.steps)
                res[way] = (committed / max(steps, 1), committed, steps, drafted, time.perf_counter() - t0)
            rows.append((label, kind, res))
            s, a = res["sampled"], res["argmax"]
            print(f"T {label:<13} {kind:<7} sampled τ {s[0]:.3f} ({s[1]} tokens / {s[2]} steps)   "
                  f"argmax τ {a[0]:.3f} ({a[1]} / {a[2]})   {s[4] + a[4]:.0f} s", flush=True)

    print(f"\n| T, filter | drafter | sampled τ | argmax τ | argmax / sampled |  ({len(prompts)} prompts x "
          f"{args.seeds} seeds, {args.tokens} tokens, {time.perf_counter() - t_start:.0f} s)")
    print("|---|---|---|---|---|")
    for label, kind, res in rows:
        s, a = res["sampled"][0], res["argmax"][0]
        print(f"| {label} | {kind} | {s:.3f} | {a:.3f} | {a / s:.2f} |")
    for kind in ("dflash", "eagle3"):
        s = [r["sampled"][0] for _, k, r in rows if k == kind]
        a = [r["argmax"][0] for _, k, r in rows if k == kind]
        print(f"| mean | {kind} | {sum(s) / len(s):.3f} | {sum(a) / len(a):.3f} | {sum(a) / sum(s):.2f} |")


if __name__ == "__main__":
    main()
