"""GPU: time a 2048- and 8192-token prefill of random Qwen3-4B shapes and list the top CUDA kernels."""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0, max_position_embeddings=16384)
for t in (2048, 8192):
    ids = torch.randint(0, 151936, (t,)).tolist()
    s = Session(model, t + 64)
    for _ in range(2):
        s.reset()
        s.forward(ids)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    s.reset()
    s.forward(ids)
    torch.cuda.synchronize()
    print(f"prefill {t}: {(time.perf_counter() - t0) * 1000:.1f} ms", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        s.reset()
        s.forward(ids)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60), flush=True)
