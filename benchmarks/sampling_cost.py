"""GPU: what the sampled path adds to a step, piece by piece (issue: sampled steps within 1.05x greedy for plain and
DFlash, 1.15x for EAGLE-3 chains). Each piece is captured in a CUDA graph (as the engine runs it) and replayed;
µs per replay, best of 3 rounds of 200. float32 logits, as ops.logits writes them.

1. The sampled path's pieces: rows 1 (a plain decode), 8 (an EAGLE-3 verify) and 16 (a DFlash verify / its block's
   15 drafts) over Qwen3's 151,936 tokens, 16 over Qwen3.5's 248,320, and 1 row over a 32,000-token draft head (an
   EAGLE-3 chain's position). "torch" and "kernels'" columns force either path; "draw", "sampled verdict" and
   "DFlash drafts + q" are the engine's (the kernels where they run).
2. The top-k alone: torch.topk against kernels/sampling.top_k, with DFlash 2's selector (7 draft rows, k = 16).
3. kernels/sampling's sizes (CHUNK, MERGE_KEYS) against each other.

    PYTHONUNBUFFERED=1 python benchmarks/sampling_cost.py

The engine filters rows with the kernels at every vocabulary (they won at each of table 1's); CHUNK and MERGE_KEYS
come from table 3's fastest exact row.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_cli.kernels import sampling as kernels  # noqa: E402
from dflash_cli.layers import ops  # noqa: E402
from dflash_cli.runtime import sampling  # noqa: E402
from dflash_cli.runtime.sampling import K_MAX, SamplingParams, TOP_K  # noqa: E402


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


def torch_filtered(logits, s):
    with ops.reference_only():
        return sampling.filtered(logits, TOP_K, s)


def kernels_filtered(logits, s, out):
    kernels.filtered(logits, K_MAX, s.temperature, s.top_p, s.top_k, out.ids, out.probs)


def exact(logits, k) -> bool:
    """kernels' top_k against a stable descending sort (float32 random logits: no ties among the largest)."""
    values, ids = kernels.top_k(logits, k)
    want = torch.sort(logits, dim=-1, descending=True, stable=True)
    return torch.equal(values, want.values[:, :k]) and torch.equal(ids, want.indices[:, :k])


def main() -> None:
    s = sampling.begin(SamplingParams(0.6, 0.95, 20, seed=0), "cuda")
    print(f"device {torch.cuda.get_device_name()}, kernels/sampling CHUNK {kernels.CHUNK}, "
          f"MERGE_KEYS {kernels.MERGE_KEYS}")
    print("| rows x vocab | argmax | greedy verdict | torch topk 64 | kernels' top_k 64 | torch filtered "
          "| kernels' filtered | draw | sampled verdict | DFlash drafts + q |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rows, vocab in ((1, 151936), (8, 151936), (16, 151936), (16, 248320), (1, 32000)):
        logits = torch.randn(rows, vocab, device="cuda") * 4
        ids = torch.randint(0, vocab, (rows,), device="cuda")
        out = sampling._rows(rows, logits.device)
        q = sampling.filtered(logits[:max(rows - 1, 1)], TOP_K, s)
        s.write_q(TOP_K, vocab, q)
        cells = [
            replay_us(lambda: ops.argmax_rows(logits)),
            replay_us(lambda: ops.greedy_verdict(ids, logits)),
            replay_us(lambda: torch.topk(logits, 64, dim=-1)),
            replay_us(lambda: kernels.top_k(logits, 64)),
            replay_us(lambda: torch_filtered(logits, s)),
            replay_us(lambda: kernels_filtered(logits, s, out)),
            replay_us(lambda: sampling.draw(sampling.filtered(logits, TOP_K, s), s.gen)),
            replay_us(lambda: sampling.verdict(ids, logits, TOP_K)),
            replay_us(lambda: sampling.draw(s.write_q(TOP_K, vocab, sampling.filtered(logits, TOP_K, s)), s.gen)),
        ]
        print(f"| {rows} x {vocab} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")

    print("\n| rows x vocab, k | torch.topk | kernels' top_k | exact |")
    print("|---|---|---|---|")
    for rows, vocab, k in ((7, 151936, 16), (7, 248320, 16), (1, 151936, 64), (16, 151936, 64), (16, 248320, 64),
                           (1, 32000, 64)):
        logits = torch.randn(rows, vocab, device="cuda") * 4
        cells = [replay_us(lambda: torch.topk(logits, k, dim=-1)), replay_us(lambda: kernels.top_k(logits, k))]
        print(f"| {rows} x {vocab}, {k} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {exact(logits, k)} |")

    # kernels/sampling's sizes: the chunk a first-pass program takes (CHUNK // 512 warps) and the keys of a merge.
    shapes = ((1, 151936), (16, 151936), (16, 248320), (1, 32000))
    print("\n| CHUNK, MERGE_KEYS | " + " | ".join(f"filtered {r} x {v}" for r, v in shapes)
          + " | top_k 16 of 7 x 151936 |")
    print("|---|" + "---|" * (len(shapes) + 1))
    inputs = {shape: torch.randn(*shape, device="cuda") * 4 for shape in shapes}
    selector = torch.randn(7, 151936, device="cuda") * 4
    saved = kernels.CHUNK, kernels.MERGE_KEYS
    try:
        for chunk in (2048, 4096, 8192, 16384):
            for merge in (512, 1024):
                kernels.CHUNK, kernels.MERGE_KEYS = chunk, merge
                cells = [replay_us(lambda: kernels_filtered(x, s, sampling._rows(x.shape[0], x.device)))
                         for x in inputs.values()]
                cells.append(replay_us(lambda: kernels.top_k(selector, 16)))
                ok = all(exact(x, 64) for x in inputs.values()) and exact(selector, 16)
                print(f"| {chunk}, {merge} | " + " | ".join(f"{c:.1f}" for c in cells) + " |"
                      + ("" if ok else " NOT EXACT"))
    finally:
        kernels.CHUNK, kernels.MERGE_KEYS = saved

    # The pieces of one sampled verdict at 16 rows, to see which kernel dominates.
    logits = torch.randn(16, 151936, device="cuda") * 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            sampling.verdict(torch.randint(0, 151936, (16,), device="cuda"), logits, TOP_K)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))


if __name__ == "__main__":
    main()
