"""GPU: does the KV cache's layout hold the decode attention back?

The cache is [layers, positions, kv_heads, head_dim]: a split program of one KV head reads 256-byte rows 2 KB
apart. Head-major [layers, kv_heads, positions, head_dim] gives each program one contiguous run. The same split +
merge kernels take either through their strides; this times both (36 layers' own caches in one CUDA graph, as
attention_sweep.py does), checked against the torch reference first, and a plain streaming read for the ceiling.
Env: LENGTHS (visible keys), WINDOWS (window per length; default the graph's power of two), SETTINGS as in
attention_sweep.py ("programs/block_s/warps/stages", for one row; 16-row spans take attention.SPAN_PROGRAMS and
SPAN_MIN_SPLIT, and kv_layout/probe.log labels them with the first setting).
"""

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_sweep import window  # noqa: E402
from gemm_bench import copy_bandwidth, graph_time  # noqa: E402

from dflash_cli.engine import ops  # noqa: E402
from dflash_cli.engine.kernels import attention  # noqa: E402

LAYERS, H, KV, D = 36, 32, 8, 128
LENGTHS = [int(x) for x in os.environ.get("LENGTHS", "1100,8300").split(",")]
WINDOWS = [int(x) for x in os.environ["WINDOWS"].split(",")] if os.environ.get("WINDOWS") else None
SETTINGS = [tuple(int(x) for x in v.split("/")) for v in os.environ.get(
    "SETTINGS", "512/64/0/0 256/128/0/0 1024/64/0/0 512/64/8/3 256/128/8/3").split()]


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in range(ITERS):
        offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def read_bandwidth() -> str:
    """GB/s of a plain streaming read of 32 x 64 MB (beyond L2), per program size."""
    n = 32 << 20
    bufs = [torch.ones(n, dtype=torch.bfloat16, device="cuda") for _ in range(32)]
    line = []
    for block, iters in ((2048, 4), (4096, 8), (8192, 4), (4096, 32)):
        out = torch.empty(triton.cdiv(n, block * iters), device="cuda")
        t = graph_time(lambda i: _read_kernel[(out.numel(),)](bufs[i], out, n, BLOCK=block,  # noqa: B023
                                                              ITERS=iters, num_warps=8), len(bufs))
        line.append(f"{block}x{iters} {2 * n / t / 1e9:.0f}")
    return ", ".join(line)


def main():
    torch.manual_seed(0)
    print(f"device {torch.cuda.get_device_name()}; copy {copy_bandwidth():.0f} GB/s; read (block x iters) "
          f"{read_bandwidth()} GB/s")
    for idx, n in enumerate(LENGTHS):
        w = WINDOWS[idx] if WINDOWS else window(n)
        nbytes = n * KV * D * 2 * 2
        caches = {}
        caches["pos"] = [torch.randn(LAYERS, w, KV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        for layout in ("pos", "head"):
            if layout == "head":  # the same values, head-major, seen through a [w, KV, D] view
                caches["head"] = [c.transpose(1, 2).contiguous() for c in caches["pos"]]
                del caches["pos"]
                torch.cuda.empty_cache()
            kc, vc = caches[layout]

            def kv(i, kc=kc, vc=vc, layout=layout):
                return (kc[i], vc[i]) if layout == "pos" else (kc[i].transpose(0, 1), vc[i].transpose(0, 1))

            for rows in (1, 16):
                q = torch.randn(rows, H, D, device="cuda", dtype=torch.bfloat16, generator=None)
                limit = torch.arange(n - rows, n, device="cuda")
                k0, v0 = kv(0)
                vis = torch.arange(w, device="cuda")[None, :] <= limit[:, None]
                ref = ops.attention_masked(q.float(), k0.float(), v0.float(), vis, D ** -0.5)
                line = []
                for programs, block_s, warps, stages in SETTINGS:
                    if rows > 1 and (programs, block_s, warps, stages) != SETTINGS[0]:
                        continue
                    attention.PROGRAMS, attention.BLOCK_S = programs, block_s
                    attention.SPLIT_WARPS, attention.SPLIT_STAGES = warps or None, stages or None
                    got = attention.attention_window(q, k0, v0, limit, D ** -0.5).float()
                    err = ((got - ref).norm() / ref.norm()).item()
                    assert err < 2e-2, (n, layout, rows, programs, block_s, err)
                    us = 1e6 * graph_time(lambda i: attention.attention_window(q, *kv(i), limit, D ** -0.5),  # noqa: B023
                                          LAYERS, reps=20)
                    label = f"{programs}/{block_s}/{warps}/{stages}" if rows == 1 else "span splits"
                    line.append(f"{label} {us:.2f} ({nbytes / us / 1e3:.0f})")
                print(f"{n} keys (window {w}) {layout}-major, {rows} rows, us (GB/s): " + ", ".join(line))
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
