"""Session 39: what the greedy verdict (the argmax's two kernels) adds to a decode step and a 16-row verify: graph
replays of the same step with accept (logits, then the verdict inside the graph) and without (logits only), ctx 1024
(CTX), Qwen3-4B shapes, random weights, bf16."""

import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.step_profile import replay_ms  # noqa: E402
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

ctx = int(os.environ.get("CTX", "1024"))
model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
session = Session(model, ctx + 256, "graphs")
session.forward(list(range(ctx)))
g = session.fast
one = [5]
span = list(range(5, 21))
for rnd in range(2):
    row = []
    for name, ids, all_logits in (("decode", one, False), ("verify 16", span, True)):
        for accept in (False, True):
            row.append(f"{name} {'verdict' if accept else 'logits '} "
                       f"{replay_ms(lambda: g(ids, ctx, (), all_logits, accept), 100):.4f}")
    print(f"round {rnd}: " + " | ".join(row))
