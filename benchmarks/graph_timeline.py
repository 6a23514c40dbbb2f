"""GPU: what each kernel of a step costs inside its CUDA graph, from the kernels' end times.

With programmatic dependent launch a kernel starts early and waits, so its duration says little; what it adds
to the step is how much later it ends than the kernel before it (its marginal time). Replays the decode step
(ctx 1024 and 8192) and the 16-row verify under the profiler, orders the kernels by end time,
names each by its place in the layer (qkv, rope, split, merge, o, norm, gate_up, down) and prints, per role,
the marginal time per layer and, for the products, the weight bytes over it (GB/s).
"""

import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import gpu_intervals, prefilled_graphs, profiled  # noqa: E402
from dflash_cli.synthetic import random_target  # noqa: E402

CTX = 1024


def kernel_events(fn, replays=4):
    """The kernels of `replays` replays, ordered by end time. The replays are apart (a sync after each): the
    first kernel of each (the input copy) carries the host's gap as its marginal time."""
    return sorted(gpu_intervals(profiled(fn, replays, apart=True)), key=lambda e: e[1])


def roles(names: list[str]) -> list[str]:
    """Each kernel's role: by its offset from the layer's attention split kernel where the name fits the role,
    else the kernel's own name. A decode step has no RoPE kernel (the split kernel does it: attention_fresh)."""
    out = [n[:40] for n in names]
    gemm = ("skinny_m", "tile16_")
    fits = {"qkv": gemm, "rope": ("qk_norm_rope",), "merge": ("merge",), "o": gemm, "norm1": ("norm",),
            "gate_up": ("swiglu",), "down": gemm, "norm2": ("norm",)}
    offsets = {"merge": 1, "o": 2, "norm1": 3, "gate_up": 4, "down": 5, "norm2": 6}
    # Norms inside the products (ops.fuses_norms): no norm kernels, each product named by its fusion.
    fused = {"merge": 1, "o": 2, "gate_up": 3, "down": 4}
    for i, n in enumerate(names):
        if "_split_kernel" not in n:
            continue
        out[i] = "split"
        rope = i > 0 and "qk_norm_rope" in names[i - 1]
        layout = dict(fused if i + 3 < len(names) and "norm_swiglu" in names[i + 3] else offsets,
                      **({"rope": -1, "qkv": -2} if rope else {"qkv": -1}))
        for role, off in layout.items():
            j = i + off
            if 0 <= j < len(names) and any(f in names[j] for f in fits[role]):
                out[j] = role
    return out


def table(events, weights: dict, label: str) -> None:
    marg, prev_end = defaultdict(list), events[0][0]
    for (start, end, name), role in zip(events, roles([e[2] for e in events])):
        marg[role].append(max(0.0, end - prev_end))
        prev_end = max(prev_end, end)
    print(f"\n{label}: {len(events)} kernels ({len(marg['split'])} layers over the replays)")
    print(f"  {'role':40s} {'count':>5s} {'marginal us':>12s} {'per launch':>10s} {'GB/s':>7s}")
    for role, vals in sorted(marg.items(), key=lambda kv: -sum(kv[1])):
        per = sum(vals) / len(vals)
        key = "head" if role.startswith("_skinny_kernel") else role
        gbs = f"{weights[key] / per / 1e3:7.0f}" if key in weights and per > 0 else ""
        print(f"  {role:40s} {len(vals):5d} {sum(vals):12.1f} {per:10.2f} {gbs:>7s}")


def main():
    torch.manual_seed(0)
    model = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    _, _, graphs = prefilled_graphs(model, CTX)
    layer = model.layers[0]
    nbytes = lambda w: w.numel() * w.element_size()  # noqa: E731
    weights = {"qkv": nbytes(layer.qkv), "o": nbytes(layer.o), "gate_up": nbytes(layer.gate_up),
               "down": nbytes(layer.down), "head": nbytes(model.lm_head)}
    print(f"device {torch.cuda.get_device_name()}")
    for label, fn in (("decode ctx 1024", lambda: graphs([5], CTX, (), False)),
                      ("decode ctx 8192", lambda: graphs([5], 8 * CTX, (), False)),
                      ("verify 16 rows ctx 1024", lambda: graphs(list(range(16)), CTX, (), True))):
        table(kernel_events(fn), weights, label)


if __name__ == "__main__":
    main()
