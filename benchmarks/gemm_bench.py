"""GPU: check the skinny GEMMs against torch, then time them per Qwen3-4B / drafter shape inside CUDA graphs.

python benchmarks/gemm_bench.py [--tune] [--json F]
Each timing replays a graph of back-to-back products over copies of the matrix that together exceed L2,
so every product streams its weights from HBM and no launch gap of Python is counted.
Columns: microseconds and GB/s of weight traffic for cuBLAS (torch), the Triton skinny GEMM and the
CUDA one (csrc/skinny_gemm.cu) with its default plan; with --tune, the best (warps, splits, unroll) too.
"""

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.kernels import cuda_gemm  # noqa: E402
from dflash_cli.kernels.skinny_gemm import skinny_linear as triton_linear  # noqa: E402

SHAPES = {  # name: (N, K)
    "qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728),
    "lm_head": (151936, 2560), "dflash_fc": (2560, 12800), "dflash_ctx_kv": (10240, 2560),
    "eagle_qkv": (6144, 5120),
}
# GEMM_SHAPES="name=N,K ..." times those shapes instead (e.g. one weight at several heights: how the tiles share
# out over the SMs shows as time that does not grow with N).
if os.environ.get("GEMM_SHAPES"):
    SHAPES = {name: tuple(int(v) for v in nk.split(",")) for name, nk in
              (item.split("=") for item in os.environ["GEMM_SHAPES"].split())}


def graph_time(fn, copies: int, reps: int = 5) -> float:
    """Seconds per call of fn(i) for i over the copies, replayed from one CUDA graph."""
    for i in range(copies):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(copies):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e-3 / (reps * copies)


def copy_bandwidth() -> float:
    a = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = graph_time(lambda i: b.copy_(a), 4)
    return 2 * a.numel() / t / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--plans", help="with --tune: write the fastest plan per product here (to compare with cuda_gemm.plan)")
    ap.add_argument("--ms", default="1,8,16")
    ap.add_argument("--fused", action="store_true", help="only the layer products, each plain and with its fusion")
    args = ap.parse_args()
    if args.fused:
        return fused_table([int(v) for v in args.ms.split(",")], args.tune)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    assert cuda_gemm.available(dev), cuda_gemm.unavailable_reason(dev)
    report = {"device": torch.cuda.get_device_name(), "copy_GBs": round(copy_bandwidth()), "rows": []}
    print(f"device {report['device']}  copy {report['copy_GBs']} GB/s")
    print(f"{'shape':10} {'M':>3} {'cublas us':>9} {'GB/s':>6} {'triton us':>9} {'GB/s':>6} {'cuda us':>8} {'GB/s':>6}"
          f" {'plan':>10} {'rel err':>8}" + ("  best per kernel: us GB/s (warps, splits, unroll)" if args.tune else ""))
    best = {}
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, int(160e6 // nbytes) + 1)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in [int(v) for v in args.ms.split(",")]:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x.float(), ws[0].float())
            y = cuda_gemm.skinny_linear(x, ws[0]).float()
            err = ((y - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, m, err)
            # determinism: split-K partials are added in a fixed order
            assert torch.equal(cuda_gemm.skinny_linear(x, ws[0]), cuda_gemm.skinny_linear(x, ws[0]))
            t_cublas = graph_time(lambda i: torch.nn.functional.linear(x, ws[i]), copies)
            t_triton = graph_time(lambda i: triton_linear(x, ws[i]), copies)
            t_cuda = graph_time(lambda i: cuda_gemm.skinny_linear(x, ws[i]), copies)
            row = {"shape": name, "N": n, "K": k, "M": m, "cublas_us": t_cublas * 1e6, "triton_us": t_triton * 1e6,
                   "cuda_us": t_cuda * 1e6, "plan": tuple(cuda_gemm.plan(m, n, k)), "rel_err": err}
            line = (f"{name:10} {m:>3} {t_cublas*1e6:9.1f} {nbytes/t_cublas/1e9:6.0f} {t_triton*1e6:9.1f}"
                    f" {nbytes/t_triton/1e9:6.0f} {t_cuda*1e6:8.1f} {nbytes/t_cuda/1e9:6.0f}"
                    f" {str(row['plan']):>10} {err:8.1e}")
            if args.tune and name != "lm_head":  # the vocabulary head is Triton's
                row["configs"] = {}
                for kind in ("tile8", "tile16"):
                    times = {}
                    for warps, splits, unroll in itertools.product((2, 4, 8), (1, 2, 4, 8), (2, 4, 8)):
                        cfg = (warps, splits, unroll, kind)
                        if not cuda_gemm.fits(n, cfg) or k // 32 < warps * splits * unroll:
                            continue
                        y = cuda_gemm.skinny_linear(x, ws[0], cfg)
                        assert ((y.float() - ref).norm() / ref.norm()) < 1e-2, cfg
                        times[cfg] = graph_time(lambda i: cuda_gemm.skinny_linear(x, ws[i], cfg), copies, reps=3)  # noqa: B023
                    row["configs"].update({str(c): t * 1e6 for c, t in times.items()})
                    t, cfg = min((t, c) for c, t in times.items())
                    line += f"  {kind} {t*1e6:6.1f} {nbytes/t/1e9:5.0f} {cfg[:3]}"
                    if t < best.get((m, n, k), (float("inf"),))[0]:
                        best[(m, n, k)] = (t, cfg)
            print(line, flush=True)
            report["rows"].append(row)
        del ws
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plans:
        with open(args.plans, "w") as f:
            json.dump({",".join(map(str, key)): list(cfg) for key, (t, cfg) in best.items()}, f, indent=1)


# The fusion each layer product takes when the model folds the norms and residual adds into its products:
# qkv and gate_up read the residual stream through their norm, o and down add theirs to it.
FUSIONS = {"qkv": ("norm", False), "gate_up": ("norm", True), "o": ("resid", False), "down": ("resid", False)}


def fused_table(ms: list[int], sweep: bool = False) -> None:
    """Each layer product plain and fused (its norm or residual add inside), in the same graphs of copies; with
    sweep (--tune) the fused kernel under each plan of one K split as well ("warps,unroll[t16]:us")."""
    dev = torch.device("cuda")
    print(f"{'shape':10} {'M':>3} {'plan':>18} {'plain us':>9} {'fused us':>9} {'fusion':>7}")
    for name, (kind, swiglu) in FUSIONS.items():
        n, k = SHAPES[name]
        copies = max(2, int(160e6 // (n * k * 2)) + 1)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            res = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
            extra = {"norm": 1e-6} if kind == "norm" else {"residual": res}
            plain = graph_time(lambda i: cuda_gemm.skinny_linear(x, ws[i], swiglu=swiglu), copies)
            fused = graph_time(lambda i: cuda_gemm.skinny_linear(x, ws[i], swiglu=swiglu, **extra), copies)  # noqa: B023
            line = f"{name:10} {m:>3} {str(cuda_gemm.plan(m, n, k)):>18} {plain*1e6:9.2f} {fused*1e6:9.2f} {kind:>7}"
            if sweep:  # the fused kernel under other plans: us per plan
                kinds = ("tile8", "tile16") if m > 8 else ("tile8",)
                for cfg in itertools.product((2, 4, 8), (1,), (2, 4, 8), kinds):
                    if cuda_gemm.fits(n, cfg) and k // 32 >= cfg[0] * cfg[2]:
                        t = graph_time(lambda i: cuda_gemm.skinny_linear(x, ws[i], cfg, swiglu=swiglu, **extra),  # noqa: B023
                                       copies, reps=3)
                        line += f"  {cfg[0]},{cfg[2]}{'' if cfg[3] == 'tile8' else 't16'}:{t*1e6:.1f}"
            print(line, flush=True)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
