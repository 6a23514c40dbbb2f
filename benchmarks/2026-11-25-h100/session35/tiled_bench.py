"""GPU: the CUDA GEMM on row-major against tiled weights (cuda_gemm.tile_weight), Qwen3-4B layer shapes.

python benchmarks/2026-11-25-h100/session35/tiled_bench.py, on a tree with tiled_paired.diff applied (the tiled and
paired modes of csrc/skinny_gemm.cu and cuda_gemm.tile_weight / pair_halves, not landed).
Checks that each tiled mode computes what the row-major one does, bit for bit (same chunks per warp, same sums),
then times in one process (a) qkv and gate/up alone, each layout, in graphs of copies that exceed L2, and (b) a
chain of 36 layers' four products with a decode step's fusions and L2 warm-ups (no attention) with qkv and/or
gate/up tiled (o and down, which add the residual, stay row-major), at 1, 8 and 16 rows.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 3)))
from benchmarks.gemm_bench import graph_time  # noqa: E402
from dflash_cli.engine.kernels import cuda_gemm  # noqa: E402

SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}
TILED = ("qkv", "gate_up")
LAYERS = 36
EPS = 1e-6
VARIANTS = {"row-major": (), "gate_up paired": ("gate_up_p",), "gate_up tiled": ("gate_up",), "both tiled": TILED}


def check(dev) -> None:
    for name in TILED:
        n, k = SHAPES[name]
        swiglu = name == "gate_up"
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        wt = cuda_gemm.tile_weight(w, swiglu)
        for m in (1, 3, 8, 9, 16):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            for norm in (None, EPS):
                a = cuda_gemm.skinny_linear(x, w, swiglu=swiglu, norm=norm)
                b = cuda_gemm.skinny_linear(x, wt, swiglu=swiglu, norm=norm, tiled=True)
                assert torch.equal(a, b), (name, m, norm, (a.float() - b.float()).abs().max().item())
            if swiglu:
                wp = cuda_gemm.pair_halves(w)
                for norm in (None, EPS):
                    a = cuda_gemm.skinny_linear(x, w, swiglu=True, norm=norm)
                    b = cuda_gemm.skinny_linear(x, wp, swiglu=True, norm=norm, paired=True)
                    assert torch.equal(a, b), (name, m, norm, "paired")
            if m == 1:
                sq = torch.rand(1, k // 8, device=dev, dtype=torch.float32)
                a = cuda_gemm.skinny_linear(x, w, swiglu=swiglu, norm=EPS, squares=sq)
                b = cuda_gemm.skinny_linear(x, wt, swiglu=swiglu, norm=EPS, squares=sq, tiled=True)
                assert torch.equal(a, b), (name, "squares")
    print("tiled modes equal the row-major ones bit for bit (qkv, gate/up; 1, 3, 8, 9, 16 rows; plain, norm,"
          " squares)", flush=True)


def alone(dev) -> None:
    for name in TILED:
        n, k = SHAPES[name]
        copies = max(2, int(160e6 // (n * k * 2)) + 1)
        swiglu = name == "gate_up"
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        layouts = {"row": ws, "tiled": [cuda_gemm.tile_weight(w, swiglu) for w in ws]}
        if swiglu:
            layouts["paired"] = [cuda_gemm.pair_halves(w) for w in ws]
        for layout, weights in layouts.items():
            line = f"{name:8} {layout:6}"
            for m in (1, 8, 16):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                t = graph_time(lambda i: cuda_gemm.skinny_linear(x, weights[i], swiglu=swiglu, norm=EPS,  # noqa: B023
                                                                 tiled=layout == "tiled",  # noqa: B023
                                                                 paired=layout == "paired"), copies)  # noqa: B023
                line += f"  m{m}: {t * 1e6:6.2f} us {n * k * 2 / t / 1e9:5.0f} GB/s"
            print(line, flush=True)
        del ws, layouts
        torch.cuda.empty_cache()


def chain(dev) -> None:
    layers = []
    for _ in range(LAYERS):
        lw = {name: torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for name, (n, k) in SHAPES.items()}
        for name in TILED:
            lw[name + "_t"] = cuda_gemm.tile_weight(lw[name], name == "gate_up")
        lw["gate_up_p_t"] = cuda_gemm.pair_halves(lw["gate_up"])
        layers.append(lw)
    warm = 4 << 20
    gb = sum(n * k * 2 for n, k in SHAPES.values()) * LAYERS / 1e9
    for m in (1, 8, 16):
        h0 = torch.randn(m, 2560, device=dev, dtype=torch.bfloat16)
        attn = torch.randn(m, 4096, device=dev, dtype=torch.bfloat16)
        line = f"chain of {LAYERS} layers, {m:2} rows, ms:"
        for label, tiled in VARIANTS.items():
            def w(lw, name, tiled=tiled):
                if name == "gate_up" and "gate_up_p" in tiled:
                    return lw["gate_up_p_t"]
                return lw[name + "_t"] if name in tiled else lw[name]

            def step(_i, h0=h0, attn=attn, m=m, tiled=tiled, w=w):
                h, sq = h0, None
                for li, lw in enumerate(layers):
                    nxt = w(layers[(li + 1) % LAYERS], "qkv")
                    cuda_gemm.skinny_linear(h, w(lw, "qkv"), norm=EPS, squares=sq, tiled="qkv" in tiled,
                                            warm=((lw["o"].data_ptr(), warm),))
                    sq1 = torch.empty((1, 320), dtype=torch.float32, device=dev) if m == 1 else None
                    h1 = cuda_gemm.skinny_linear(attn, lw["o"], residual=h, squares_out=sq1,
                                                 warm=((w(lw, "gate_up").data_ptr(), warm),))
                    a = cuda_gemm.skinny_linear(h1, w(lw, "gate_up"), swiglu=True, norm=EPS, squares=sq1,
                                                tiled="gate_up" in tiled, paired="gate_up_p" in tiled,
                                                warm=((lw["down"].data_ptr(), warm),))
                    sq = torch.empty((1, 320), dtype=torch.float32, device=dev) if m == 1 else None
                    h = cuda_gemm.skinny_linear(a, lw["down"], residual=h1, squares_out=sq,
                                                warm=((nxt.data_ptr(), warm),))
                return h

            t = graph_time(step, 1, reps=20)
            line += f"  {label} {t * 1e3:.4f} ({gb / t:4.0f} GB/s)"
        print(line, flush=True)


if __name__ == "__main__":
    dev = torch.device("cuda")
    assert cuda_gemm.available(dev), cuda_gemm.unavailable_reason(dev)
    check(dev)
    for r in range(int(os.environ.get("ROUNDS", "2"))):
        chain(dev)
    alone(dev)
