"""GPU: the hand GEMM's layer products at 1 and 16 rows, 4 launches each, to profile under Nsight Compute, e.g.
`ncu --section MemoryWorkloadAnalysis -k regex:"skinny|tile16" python benchmarks/gemm_ncu.py` (random Qwen3-4B
shapes; read the last launch of each group of 4, as the record in git history was made (commit ad746c8, benchmarks/2026-11-25-h100/gemm16/ncu.txt)). Where a 16-row product loses to a 1-row one of the same weight:
the L2-to-SM traffic of x (every block reads all of it), L1 hits, occupancy, stalls.
Env: NCU_SHAPES (names from gemm_bench.SHAPES), NCU_MS (rows)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_bench import SHAPES  # noqa: E402

from dflash_cli.kernels import cuda_gemm  # noqa: E402

NAMES = os.environ.get("NCU_SHAPES", "gate_up down").split()
MS = [int(m) for m in os.environ.get("NCU_MS", "1,16").split(",")]

dev = torch.device("cuda")
assert cuda_gemm.available(dev), cuda_gemm.unavailable_reason(dev)
for name in NAMES:
    n, k = SHAPES[name]
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    for m in MS:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        swiglu = name == "gate_up"
        for _ in range(4):  # the profiler takes the launches after --launch-skip
            cuda_gemm.skinny_linear(x, w, swiglu=swiglu)
        torch.cuda.synchronize()
        print(name, m, cuda_gemm.plan(m, n, k), flush=True)
