"""GPU: what capturing a prefill graph costs, and where. For prompts of ROWS (default 1024 and 2048) rows, with
no states captured and with DFlash's and EAGLE-3's target layers: the wall time of the first forward (its capture,
prefill_capture_at_first_use) split into the side-stream warm-up, the capture itself, gc and the rest, then one
replay."""

import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine import graphs  # noqa: E402
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_drafter, random_qwen3  # noqa: E402

model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
layers = {"none": ()}
for kind in ("dflash", "eagle3"):
    layers[kind] = tuple(random_drafter("qwen3-4b", kind, model).capture)
spent: dict = {}


def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
    return wrapper


graphs.Graphs._run = timed("forward calls (warm-up + capture)", graphs.Graphs._run)
graphs.gc.collect = timed("gc.collect", gc.collect)
enter, leave = torch.cuda.graph.__enter__, torch.cuda.graph.__exit__
torch.cuda.graph.__enter__ = timed("graph __enter__", enter)
torch.cuda.graph.__exit__ = timed("graph __exit__", leave)
V = model.cfg.vocab_size
for rows in [int(r) for r in os.environ.get("ROWS", "1024,2048").split(",")]:
    s = Session(model, rows + 128, "graphs")
    s.fast.prefill_capture_at_first_use = True
    ids = torch.randint(0, V, (rows,)).tolist()
    for kind, capture in layers.items():
        spent.clear()
        s.reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.forward(ids, capture=capture)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        s.reset()
        t0 = time.perf_counter()
        s.forward(ids, capture=capture)
        torch.cuda.synchronize()
        replay = time.perf_counter() - t0
        parts = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in spent.items())
        print(f"rows {rows} capture {kind}: first use {first * 1e3:.0f} ms ({parts}), replay {replay * 1e3:.1f} ms")
