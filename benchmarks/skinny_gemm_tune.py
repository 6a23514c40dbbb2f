"""GPU: check the Triton skinny GEMM against torch, then time it per Qwen3-4B / DFlash shape and config.

python benchmarks/skinny_gemm_tune.py  -> a table of GB/s (torch vs best config) and the best configs as JSON.
Weights rotate over copies larger than L2, so every timed call streams its matrix from HBM.
"""

import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine.kernels.skinny_gemm import config_for, skinny_linear  # noqa: E402

SHAPES = {  # name: (N, K)
    "qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728),
    "lm_head": (151936, 2560), "dflash_fc": (2560, 12800), "eagle_qkv": (6144, 5120),
}
CONFIGS = list(itertools.product((16, 32, 64), (128, 256, 512), (1, 2, 4, 8)))


def timed(fn, reps=60):
    for _ in range(3):
        fn(0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        fn(i)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e-3


def main():
    torch.manual_seed(0)
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    best_cfg = {}
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(200e6 // (n * k * 2)) + 1)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        nbytes = n * k * 2
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x.float(), ws[0].float())
            t_torch = timed(lambda i: torch.nn.functional.linear(x, ws[i % copies]))
            results = []
            for cfg in CONFIGS:
                if cfg[1] * cfg[2] > k:
                    continue
                y = skinny_linear(x, ws[0], cfg).float()
                err = ((y - ref).abs().max() / ref.abs().max()).item()
                assert err < 2e-2, (name, m, cfg, err)
                results.append((timed(lambda i: skinny_linear(x, ws[i % copies], cfg)), cfg))
            t_best, cfg_best = min(results)
            t_default = timed(lambda i: skinny_linear(x, ws[i % copies]))
            row = {"shape": name, "N": n, "K": k, "M": m, "torch_us": round(t_torch * 1e6, 1),
                   "torch_GBs": round(nbytes / t_torch / 1e9), "best_us": round(t_best * 1e6, 1),
                   "best_GBs": round(nbytes / t_best / 1e9), "best_cfg": cfg_best,
                   "default_cfg": config_for(n, k), "default_GBs": round(nbytes / t_default / 1e9)}
            out["rows"].append(row)
            best_cfg.setdefault(name, {})[m] = cfg_best
            print(f"{name:10s} M={m:2d} torch {row['torch_GBs']:5d} GB/s | triton best {row['best_GBs']:5d} GB/s "
                  f"{cfg_best} | default {row['default_GBs']:5d} GB/s {row['default_cfg']}", flush=True)
        del ws
    out["best"] = best_cfg
    path = os.path.join(os.environ.get("OUT", "."), "skinny_gemm_tune.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
