"""GPU: a 2048-token prefill replayed from its CUDA graph against the eager forward (DFLASH_PREFILL_GRAPHS=0's
path). Per run: the time the host takes to queue the prefill (no sync until it returns) and the time until the
first token is read, RUNS runs per path with a few decode steps on graphs between them (as the bench runs after
each prompt), after one untimed warm-up (the graph's capture). Then, behind 100+ ms of queued device sleep,
whether either path waits for the device while queuing, and the host's time per op of the eager forward
(profiler)."""

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine import graphs  # noqa: E402
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

T = int(os.environ.get("T", "2048"))
RUNS = int(os.environ.get("RUNS", "12"))
model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
V = model.cfg.vocab_size
graphed_rows = graphs.PREFILL_MAX_ROWS


def prompt(run: int) -> list[int]:
    return torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(run)).tolist()


for path in ("graph", "eager"):
    graphs.PREFILL_MAX_ROWS = graphed_rows if path == "graph" else 0
    s = Session(model, T + 64, "graphs")
    s.fast.prefill_capture_at_first_use = True
    firsts = []
    for run in range(RUNS + 1):
        s.reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = s.forward(prompt(run))
        t1 = time.perf_counter()
        tok = int(out.logits[-1].argmax().item())
        t2 = time.perf_counter()
        for _ in range(7):  # a few decode steps on graphs, as the bench runs after each prefill
            s.forward([tok], accept=True)
        torch.cuda.synchronize()
        if run:
            firsts.append((t2 - t0) * 1e3)
            print(f"{path} run {run}: host queued the prefill in {(t1 - t0) * 1e3:.1f} ms, "
                  f"first token after {(t2 - t0) * 1e3:.1f} ms")
    print(f"{path}: first token mean {statistics.mean(firsts):.2f} ms, median {statistics.median(firsts):.2f}, "
          f"max {max(firsts):.2f} over {RUNS} runs")
    ids = prompt(0)
    torch.cuda._sleep(200_000_000)  # does queuing wait for the device anywhere?
    t0 = time.perf_counter()
    s.reset()
    s.forward(ids)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{path}, behind 100+ ms of device sleep: host queued the prefill in {(t1 - t0) * 1e3:.1f} ms, "
          f"device done after {(time.perf_counter() - t0) * 1e3:.1f} ms")

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:  # the eager path's host ops
    s.reset()
    s.forward(prompt(1))
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50))
