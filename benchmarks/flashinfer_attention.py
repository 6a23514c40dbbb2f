"""GPU: our decode-row attention against FlashInfer's single-request decode kernel, Qwen3-4B heads.

One query row (32 query heads, 8 KV heads, head dim 128, bf16) over K/V of the static cache's layout
[keys, KV, D]. 36 layers' K/V, each its own buffer (one layer's K/V would stay in L2 between calls), called
in turn as a step does; timed as a CUDA graph of the 36 calls where it captures, else from the profiler's
kernel durations. Ours reads a window bucket with the visible length in device memory (as in a step);
FlashInfer is given exactly the visible keys (it cannot take a length from device memory without a plan).
Needs flashinfer-python (../shared/gpu/README.md). Prints one line per length and a JSON file with --json.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.kernels import attention  # noqa: E402

LAYERS, H, KV, D = 36, 32, 8, 128


def graph_us(calls) -> float | None:
    try:
        for c in calls:
            c()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in calls:
                c()
    except RuntimeError as exc:
        print(f"  (no graph: {str(exc).splitlines()[0][:100]})")
        return None
    for _ in range(3):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(20):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / 20 / len(calls)


def kernel_us(calls) -> float:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            for c in calls:
                c()
        torch.cuda.synchronize()
    total = sum(e.self_device_time_total for e in prof.key_averages())
    return total / (3 * len(calls))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    import flashinfer

    scale = D ** -0.5
    rows = []
    for keys, window in ((1100, 2048), (4200, 8192), (8300, 16384)):
        torch.manual_seed(0)
        ks = [torch.randn(window, KV, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        vs = [torch.randn(window, KV, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        qs = [torch.randn(1, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        limit = torch.tensor([keys - 1], device="cuda")
        ours = [lambda i=i: attention.attention_window(qs[i], ks[i], vs[i], limit, scale) for i in range(LAYERS)]
        theirs = [lambda i=i: flashinfer.single_decode_with_kv_cache(qs[i][0], ks[i][:keys], vs[i][:keys],
                                                                       sm_scale=scale) for i in range(LAYERS)]
        a, b = ours[0]().float().view(H, D), theirs[0]().float()
        ref = torch.nn.functional.scaled_dot_product_attention(
            qs[0].transpose(0, 1)[None].float(), ks[0][:keys].transpose(0, 1)[None].float(),
            vs[0][:keys].transpose(0, 1)[None].float(), scale=scale, enable_gqa=True)[0, :, 0]
        err = lambda x: ((x - ref).norm() / ref.norm()).item()  # noqa: E731
        kv_bytes = keys * KV * D * 2 * 2
        row = {"keys": keys, "window": window, "kv_mb": kv_bytes / 1e6, "ours_rel_err": err(a),
               "flashinfer_rel_err": err(b)}
        for name, calls in (("ours", ours), ("flashinfer", theirs)):
            row[f"{name}_kernel_us"] = kernel_us(calls)
            row[f"{name}_graph_us"] = graph_us(calls)
        per = row["ours_graph_us"] or row["ours_kernel_us"]
        fi = row["flashinfer_graph_us"] or row["flashinfer_kernel_us"]
        print(f"{keys} keys ({row['kv_mb']:.1f} MB): ours {per:.2f} us/layer ({kv_bytes / per / 1e3:.0f} GB/s; "
              f"kernels {row['ours_kernel_us']:.2f}), FlashInfer {fi:.2f} us/layer ({kv_bytes / fi / 1e3:.0f} GB/s; "
              f"kernels {row['flashinfer_kernel_us']:.2f}); rel err vs fp32 {row['ours_rel_err']:.1e} / "
              f"{row['flashinfer_rel_err']:.1e}")
        rows.append(row)
        del ks, vs
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "flashinfer": flashinfer.__version__, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
