"""GPU: what the sampled path adds to a step, piece by piece (issue: sampled steps within 1.05x greedy for plain and
DFlash, 1.15x for EAGLE-3 chains). Each piece is captured in a CUDA graph (as the engine runs it) and replayed;
µs per replay, best of 3 rounds of 200.

Rows 1 (a plain decode), 16 (a DFlash verify / its block's 15 drafts) and 8 (an EAGLE-3 verify) over Qwen3's 151,936
tokens, and 1 row over a 32,000-token draft head (an EAGLE-3 chain's position), bf16 logits as the head writes them.

    PYTHONUNBUFFERED=1 python benchmarks/sampling_cost.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_cli.layers import ops  # noqa: E402
from dflash_cli.runtime import sampling  # noqa: E402
from dflash_cli.runtime.sampling import SamplingParams, TOP_K  # noqa: E402


def replay_us(fn, reps: int = 200) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / reps)
    return best


def main() -> None:
    s = sampling.begin(SamplingParams(0.6, 0.95, 20, seed=0), "cuda")
    print(f"device {torch.cuda.get_device_name()}")
    print("| rows x vocab | argmax | greedy verdict | topk 64 | filtered | draw | sampled verdict "
          "| DFlash drafts + q |")
    print("|---|---|---|---|---|---|---|---|")
    for rows, vocab in ((1, 151936), (8, 151936), (16, 151936), (1, 32000)):
        logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 4
        ids = torch.randint(0, vocab, (rows,), device="cuda")
        q = sampling.filtered(logits[:max(rows - 1, 1)].float(), TOP_K, s)
        s.write_q(TOP_K, vocab, q)
        cells = [
            replay_us(lambda: ops.argmax_rows(logits)),
            replay_us(lambda: ops.greedy_verdict(ids, logits)),
            replay_us(lambda: torch.topk(logits, 64, dim=-1)),
            replay_us(lambda: sampling.filtered(logits, TOP_K, s)),
            replay_us(lambda: sampling.draw(sampling.filtered(logits, TOP_K, s), s.gen)),
            replay_us(lambda: sampling.verdict(ids, logits, TOP_K)),
            replay_us(lambda: sampling.draw(s.write_q(TOP_K, vocab, sampling.filtered(logits, TOP_K, s)), s.gen)),
        ]
        print(f"| {rows} x {vocab} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    # The pieces of one filtered() call at 16 rows, to see which kernel dominates.
    logits = torch.randn(16, 151936, device="cuda", dtype=torch.bfloat16) * 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            sampling.verdict(torch.randint(0, 151936, (16,), device="cuda"), logits, TOP_K)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))


if __name__ == "__main__":
    main()
