"""GPU: warps per attention-merge program. Split + merge of one layer's window attention, 36 layers
back to back in a CUDA graph (Qwen3-4B shapes, bf16), timed for 1, 2, 4 and 8 warps."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_bench import graph_time  # noqa: E402

from dflash_cli.engine.kernels import attention  # noqa: E402

LAYERS, H, KV, D = 36, 32, 8, 128


def main():
    for n, rows in ((1100, 16), (1100, 1), (8300, 1), (8300, 16)):
        w = 256
        while w < n:
            w *= 2
        k = torch.randn(LAYERS, w, KV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(rows, H, D, device="cuda", dtype=torch.bfloat16)
        lim = torch.arange(n - rows, n, device="cuda")
        line = []
        for warps in (1, 2, 4, 8):
            attention.MERGE_WARPS = warps
            t = graph_time(lambda i: attention.attention_window(q, k[i], v[i], lim, D ** -0.5), LAYERS, reps=30)  # noqa: B023
            line.append(f"warps {warps}: {t * 1e6:.2f}")
        print(f"len {n} rows {rows} us/launch (split+merge, graph): " + ", ".join(line), flush=True)
        del k, v


if __name__ == "__main__":
    main()
