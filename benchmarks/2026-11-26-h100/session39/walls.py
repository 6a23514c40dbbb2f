"""Session 39 A/B: a plain generation's wall per step (benchmarks/plain_overhead.walls: 5 greedy generations of 128
tokens after a CTX-token prompt, Qwen3-4B shapes, random weights, bf16), in whichever tree is the working
directory. Run from the repository root of the tree to time."""

import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.plain_overhead import NEW, walls  # noqa: E402
from benchmarks.step_profile import prompt_and_sequence  # noqa: E402
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

ctx = int(os.environ.get("CTX", "8192"))
model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
session = Session(model, ctx + NEW + 64, "graphs")
prompt = prompt_and_sequence(NEW)[0]
for rnd in range(int(os.environ.get("ROUNDS", "2"))):
    w = walls(session, prompt)
    print(f"{os.environ.get('TREE', '?')} ctx {ctx} round {rnd}: wall ms/step median {w[len(w) // 2]:.4f} "
          f"(all {' '.join(f'{x:.4f}' for x in w)})")
