"""GPU: where a decode step's time goes. Random Qwen3-4B shapes, bf16, context 1024.

Times graph replays of the decode step (1 row) and a 16-row verify, then profiles the same static forwards
run eagerly (kernel durations, not launch gaps) and a DFlash draft, listing kernels by total time per step.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine.graphs import target_graphs  # noqa: E402
from dflash_cli.synthetic import random_drafter, random_qwen3  # noqa: E402

CTX = int(os.environ.get("CTX", "1024"))


def replay_ms(fn, reps=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def profile(fn, steps, label):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / steps, e.count / steps, e.key) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\n{label}: kernels {total / 1000:.3f} ms per step, {sum(r[1] for r in rows):.0f} launches")
    for us, n, key in rows[:18]:
        print(f"  {us:8.1f} us  {n:5.0f}x  {us / n:6.1f} us/launch  {key[:90]}")


def main():
    torch.manual_seed(0)
    model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    drafter = random_drafter("qwen3-4b", "dflash", model)
    cache = model.new_cache(CTX + 256)
    ids = torch.randint(0, 1000, (CTX,), device="cuda")
    out = model.forward(ids, 0, cache, capture=drafter.capture)
    graphs = target_graphs(model, cache, use_graphs=True)
    static = target_graphs(model, cache, use_graphs=False)
    one = lambda: graphs([5], CTX, (), False)  # noqa: E731
    span = lambda: graphs(list(range(16)), CTX, drafter.capture, True)  # noqa: E731
    print(f"device {torch.cuda.get_device_name()}  ctx {CTX}")
    print(f"graph replay: decode {replay_ms(one):.3f} ms, verify 16 rows {replay_ms(span):.3f} ms")
    profile(lambda: static([5], CTX, (), False), 5, "decode step (eager static)")
    profile(lambda: static(list(range(16)), CTX, drafter.capture, True), 5, "verify 16 rows (eager static)")
    drafter.reset(CTX + 256, "graphs")
    drafter.absorb(out.hidden, 0)
    draft = lambda: drafter.draft_logits(5, 15)  # noqa: E731
    print(f"graph replay: DFlash draft {replay_ms(draft):.3f} ms")
    drafter.reset(CTX + 256, "static")
    drafter.absorb(out.hidden, 0)
    profile(draft, 5, "DFlash draft (eager static)")


if __name__ == "__main__":
    main()
