"""GPU: do a plain generation's first decode steps run slower after a long prefill, and why. Random Qwen3-4B shapes,
bf16, CTX (default 8192).

`plain_gap.py` found the decode graph's first ~25 replays after a prefill of 8192 tokens 50-150 us slower than the
rest. Here: the generation's wall per step as the bench runs it, then with the host idle a while (PAUSE_MS, several)
between the prefill and the first decode step, and the decode graphs' spans of each (profiled). SMI=1 also polls
nvidia-smi (SM clock, power) every 10 ms over a few plain generations, into $OUT/smi.csv.
"""

import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.plain_gap import spans_and_gaps  # noqa: E402
from benchmarks.step_profile import plain_session  # noqa: E402
from dflash_cli.runtime.generation import PlainDecoder, Request, generate  # noqa: E402
from dflash_cli.runtime.sampling import SamplingParams  # noqa: E402

CTX = int(os.environ.get("CTX", "8192"))
NEW = 128


class Paused(PlainDecoder):
    """A plain decoder that leaves the device idle `pause` seconds after the prefill (outside the decode time)."""

    def __init__(self, pause: float):
        super().__init__()
        self.pause = pause

    def prefill(self, session, ids):
        logits = super().prefill(session, ids)
        torch.cuda.synchronize()
        time.sleep(self.pause)
        return logits


def main():
    session, prompt = plain_session(NEW, CTX)
    print(f"device {torch.cuda.get_device_name()}  ctx {CTX}")

    def run(pause: float):
        session.reset()
        return generate(session, Paused(pause), Request(prompt, SamplingParams(), NEW))

    run(0)
    run(0)
    smi = None
    if os.environ.get("SMI") and os.environ.get("OUT"):
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                "--format=csv", "-lms", "10"], stdout=open(os.path.join(os.environ["OUT"], "smi.csv"), "w"))
        time.sleep(1.0)
        for _ in range(3):
            run(0)
            time.sleep(0.3)
        smi.terminate()
    for pause_ms in [int(x) for x in os.environ.get("PAUSE_MS", "0,20,100,300").split(",")]:
        ws = sorted(1000 * r.decode_s / len(r.steps) for r in (run(pause_ms / 1000) for _ in range(4)))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            run(pause_ms / 1000)
        spans, _ = spans_and_gaps(prof, trim=1)
        head = " ".join(f"{x:.0f}" for x in spans[:12])
        print(f"pause {pause_ms:4d} ms: wall ms/step {' '.join(f'{w:.4f}' for w in ws)}; spans us: first 12 {head}; "
              f"median {statistics.median(spans):.1f} mean {statistics.fmean(spans):.1f}")


if __name__ == "__main__":
    main()
