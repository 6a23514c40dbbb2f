"""GPU: does a graph-replayed prefill slow the plain decode steps after it? One process, one session: a 1024-token
prompt prefilled from its graph or eagerly (graphs.PREFILL_MAX_ROWS = 0), alternating, each followed by 128 greedy
plain decode steps (graphs, lookahead) timed as the bench times them (decode_s over tokens after the first)."""

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine import graphs  # noqa: E402
from dflash_cli.engine.generation import PlainDecoder, Request, generate  # noqa: E402
from dflash_cli.engine.sampling import SamplingParams  # noqa: E402
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
s = Session(model, 1024 + 160, "graphs")
s.fast.prefill_capture_at_first_use = True
rows = graphs.PREFILL_MAX_ROWS
ids = torch.randint(0, model.cfg.vocab_size, (1024,), generator=torch.Generator().manual_seed(0)).tolist()
times = {"graph": [], "eager": []}
for rnd in range(7):
    for path in ("graph", "eager") if rnd % 2 else ("eager", "graph"):
        graphs.PREFILL_MAX_ROWS = rows if path == "graph" else 0
        s.reset()
        r = generate(s, PlainDecoder(), Request(ids, SamplingParams(), max_tokens=128))
        if rnd:
            times[path].append(r.decode_s * 1e3)
for path, t in times.items():
    print(f"{path} prefill: decode {statistics.median(t):.2f} ms median over {len(t)} ({' '.join(f'{x:.1f}' for x in t)})")
