"""GPU: window-attention split sizes, timed as a step runs them (Qwen3-4B shapes, bf16).

1 query row (a decode step) and 16 rows (a verify span) over the graph's power-of-two window of a 36-layer
cache, 36 launches back to back in one CUDA graph (each layer its own cache: nothing stays in L2), at the
lengths a bench generation sees. Each setting is checked against the torch reference first. Prints
microseconds per launch (split + merge) and the bandwidth reached on the visible keys.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_bench import graph_time  # noqa: E402

from dflash_cli.layers import ops  # noqa: E402
from dflash_cli.kernels import attention  # noqa: E402

LAYERS, H, KV, D = 36, 32, 8, 128
LENGTHS = [int(x) for x in os.environ.get("LENGTHS", "1100,8300").split(",")]
# (programs per window, keys per block, warps, stages; 0 = Triton's default) for decode rows; 16-row spans follow
# attention.SPAN_PROGRAMS and SPAN_MIN_SPLIT instead. SETTINGS="512/64/4/3 256/128/8/3" overrides.
SETTINGS = [tuple(int(x) for x in v.split("/")) for v in os.environ.get(
    "SETTINGS", "512/64/0/0 512/64/4/2 512/64/4/4 512/64/8/3 512/64/2/3 256/128/4/3 256/128/8/3 256/128/8/4 "
    "1024/32/4/3 1024/32/2/2").split()]


def window(n: int) -> int:
    w = 256
    while w < n:
        w *= 2
    return w


def main():
    torch.manual_seed(0)
    results = []
    for n in LENGTHS:
        w = window(n)
        k = torch.randn(LAYERS, w, KV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(LAYERS, w, KV, D, device="cuda", dtype=torch.bfloat16)
        nbytes = n * KV * D * 2 * 2
        for rows in (1, 16):
            q = torch.randn(rows, H, D, device="cuda", dtype=torch.bfloat16)
            limit = torch.arange(n - rows, n, device="cuda")
            vis = torch.arange(w, device="cuda")[None, :] <= limit[:, None]
            ref = ops.attention_masked(q.float(), k[0].float(), v[0].float(), vis, D ** -0.5)
            line = []
            for programs, block_s, warps, stages in SETTINGS:
                if rows > 1 and (programs, block_s) != (512, 64):
                    continue  # spans do not use PROGRAMS
                attention.PROGRAMS, attention.BLOCK_S = programs, block_s
                attention.SPLIT_WARPS, attention.SPLIT_STAGES = warps or None, stages or None
                got = attention.attention_window(q, k[0], v[0], limit, D ** -0.5).float()
                err = ((got - ref).norm() / ref.norm()).item()
                assert err < 2e-2, (n, rows, programs, block_s, err)
                us = 1e6 * graph_time(lambda i: attention.attention_window(q, k[i], v[i], limit, D ** -0.5),  # noqa: B023
                                      LAYERS, reps=20)
                results.append({"length": n, "window": w, "rows": rows, "programs": programs, "block_s": block_s,
                                "warps": warps, "stages": stages, "us": round(us, 2),
                                "gbps": round(nbytes / us / 1e3, 1)})
                line.append(f"{programs}/{block_s}/{warps}/{stages} {us:.2f}")
            print(f"length {n} (window {w}), {rows} rows, {nbytes / 1e6:.1f} MB K/V per layer, us per launch "
                  f"(programs/block/warps/stages): " + ", ".join(line))
        del k, v
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "attention_sweep.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
