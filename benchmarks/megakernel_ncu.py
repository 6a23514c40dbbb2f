"""GPU: one launch of the persistent decode step (csrc/megakernel.cu) to profile under Nsight Compute, e.g.
`ncu --section WarpStateStats -k regex:decode_step --launch-skip 3 --launch-count 1 python benchmarks/megakernel_ncu.py`
(random Qwen3-4B weights, ctx 1024): where its warps stall (no instruction: the instruction cache; long
scoreboard: global loads; barrier; ...)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine.kernels import megakernel  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0, max_position_embeddings=4096)
cache = model.new_cache(2048)
step = megakernel.decode_step(model, cache)
if isinstance(step, str):
    sys.exit(step)
ids, pos = torch.tensor([5], device="cuda"), torch.tensor([1024], device="cuda")
for _ in range(5):
    step(ids, pos)
torch.cuda.synchronize()
print("stall:", step.stall())
