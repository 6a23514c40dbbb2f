"""GPU: is a 2048-token prefill bound by the host? Per run: the time the host takes to queue the forward (no sync
until it returns) against the time until the first token is read, eight runs with a few decode steps on graphs
between them (as the bench runs after each prompt). Then whether the forward waits for the device anywhere, and
the host's time per op (profiler)."""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

T = int(os.environ.get("T", "2048"))
model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
s = Session(model, T + 64, "graphs")
V = model.cfg.vocab_size
for run in range(8):
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(run)).tolist()
    s.reset()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = s.forward(ids)
    t1 = time.perf_counter()
    tok = int(out.logits[-1].argmax().item())
    t2 = time.perf_counter()
    for _ in range(7):  # a few decode steps on graphs, as the bench runs after each prefill
        s.forward([tok], accept=True)
    torch.cuda.synchronize()
    print(f"run {run}: host queued the prefill in {(t1 - t0) * 1e3:.1f} ms, first token after {(t2 - t0) * 1e3:.1f} ms")

# Does the forward wait for the device anywhere? Queue ~100 ms of device sleep first: without a sync inside, the
# host returns long before the device is done.
torch.cuda._sleep(200_000_000)
t0 = time.perf_counter()
s.reset()
s.forward(torch.randint(0, V, (T,)).tolist())
t1 = time.perf_counter()
torch.cuda.synchronize()
print(f"behind 100+ ms of device sleep: host queued the prefill in {(t1 - t0) * 1e3:.1f} ms, "
      f"device done after {(time.perf_counter() - t0) * 1e3:.1f} ms")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    s.reset()
    s.forward(torch.randint(0, V, (T,)).tolist())
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=50))
