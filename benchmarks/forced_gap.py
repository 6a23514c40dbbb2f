"""GPU: where `generate` at a forced τ lost to `dflash bench --synthetic` (issue 47), in one process per mode.

MODEL's random weights (as `bench --synthetic`), a PROMPT-token prompt, the capture at load (runtime/warmup.py), the
plain pre-run, then the same forced decoder timed run after run (NEW tokens, τ TAU), each line a run's decode tok/s
and ms a step:
  first        the first forced run of the process: what generate timed before (its kernels launched for the first
               time inside it, its one-row argmax without the step's carveout);
  no carveout  later runs with that argmax's L1 / shared split at the driver's choice (as before: no capture followed
               its first launch), alternated with
  carveout     the same runs after carveout.apply() on it (what forced_generate now does, and the bench had);
then `bench` (run_modes, --synthetic --synthetic-tau TAU, the same prompt length) for the same mode in this process.
Env: MODE (dflash; or eagle3), MODEL (qwen3-4b), NEW (512), TAU (6), PROMPT (9: generate's chat-rendered prompt in
product_path.py), ROUNDS (3).
Run: MODE=dflash python benchmarks/forced_gap.py; MODE=eagle3 python benchmarks/forced_gap.py
"""

import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.bench import run as bench_run  # noqa: E402
from dflash_cli.bench.forced import ForcedAcceptance, ForcedDecoder  # noqa: E402
from dflash_cli.kernels import carveout  # noqa: E402
from dflash_cli.kernels.cubin import driver  # noqa: E402
from dflash_cli.options import BenchOptions  # noqa: E402
from dflash_cli.runtime.drafters import proposer  # noqa: E402
from dflash_cli.runtime.generation import Request, generate  # noqa: E402
from dflash_cli.runtime.sampling import SamplingParams  # noqa: E402
from dflash_cli.runtime.session import Session  # noqa: E402
from dflash_cli.runtime.speculative import SpeculativeDecoder  # noqa: E402
from dflash_cli.runtime.warmup import capture_all  # noqa: E402
from dflash_cli.synthetic import random_drafter, random_target  # noqa: E402

MODE = os.environ.get("MODE", "dflash")
MODEL = os.environ.get("MODEL", "qwen3-4b")
NEW = int(os.environ.get("NEW", "512"))
TAU = float(os.environ.get("TAU", "6"))
PROMPT = int(os.environ.get("PROMPT", "9"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def main() -> None:
    dev = torch.device("cuda")
    target = random_target(MODEL, dev, torch.bfloat16)
    drafter = proposer(MODE, random_drafter(MODEL, MODE, target))
    decoder = SpeculativeDecoder(drafter, 7 if MODE == "eagle3" else None)  # the registry's chain, as generate's
    prompt = torch.randint(0, target.cfg.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    session = Session(target, PROMPT + NEW + 32)
    capture_all(session, decoder, [SamplingParams()])
    plain = generate(session, decoder, Request(prompt, SamplingParams(), NEW))
    sequence, vocab = prompt + plain.tokens, target.cfg.vocab_size
    forced = ForcedDecoder(ForcedAcceptance(drafter, sequence, TAU, vocab), decoder.draft_len)

    def run(label: str) -> None:
        session.reset()
        forced.sync(session)
        forced.proposer = ForcedAcceptance(drafter, sequence, TAU, vocab)
        r = generate(session, forced, Request(prompt, SamplingParams(), NEW))
        print(f"  {label:12s} {r.decode_tok_per_s:8.1f} tok/s  {1000 * r.decode_s / len(r.steps):.3f} ms a step  "
              f"τ {(len(r.tokens) - 1) / len(r.steps):.2f}", flush=True)

    print(f"{MODE}, {MODEL} random weights, prompt {PROMPT}, {NEW} tokens, τ {TAU:g}, {torch.cuda.get_device_name()}")
    run("first")
    fresh = [h for h in carveout._handles() if h not in carveout._done]  # kernels no capture has followed yet
    print(f"  ({len(fresh)} kernel(s) loaded after the last capture)")

    def split(percent: int) -> None:  # -1: the driver's choice (CU_SHAREDMEM_CARVEOUT_DEFAULT)
        for h in fresh:
            assert driver().cuFuncSetAttribute(ctypes.c_void_p(h), carveout._PREFERRED, percent) == 0

    for _ in range(ROUNDS):
        split(-1)
        run("no carveout")
        split(carveout.CARVEOUT)
        run("carveout")
    rep = bench_run.run_modes(BenchOptions(model=MODEL, drafts=["none", MODE], synthetic=True, synthetic_tau=TAU,
                                           synthetic_prompt_len=PROMPT, max_tokens=NEW))
    m = rep["modes"][1]
    print(f"  {'bench':12s} {m['decode_tok_per_s']:8.1f} tok/s  {m['step_ms']:.3f} ms a step  τ {m['tau']:.2f}")


if __name__ == "__main__":
    main()
