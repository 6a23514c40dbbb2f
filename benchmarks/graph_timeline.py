"""GPU: what each kernel of a step costs inside its CUDA graph, from the kernels' end times.

With programmatic dependent launch a kernel starts early and waits, so its duration says little; what it adds
to the step is how much later it ends than the kernel before it (its marginal time). Replays the decode step
(ctx 1024 and 8192) and the 16-row verify under the profiler, orders the kernels by end time,
names each by its place in the layer (qkv, rope, split, merge, o, norm, gate_up, down) and prints, per role,
the marginal time per layer and, for the products, the weight bytes over it (GB/s).
MODEL (default qwen3-4b) picks the registry entry's shapes; a Qwen3.5 hybrid (MODEL=qwen3.5-4b) gets the decode
steps only, its kernels by name and its products by role (each replay's GEMM kernels paired in order with the
model's products). Each decode step's replay time comes first, with the weights a token reads and their GB/s.
"""

import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import gpu_intervals, prefilled_graphs, profiled, replay_ms  # noqa: E402
from dflash_cli.errors import DflashError  # noqa: E402
from dflash_cli.synthetic import random_target  # noqa: E402

CTX = 1024
REPLAYS = 4  # replays profiled per step
MODEL = os.environ.get("MODEL", "qwen3-4b")
GEMM = ("skinny", "tile16_", "gemm", "gemv", "nvjet")  # the hand CUDA GEMM, the Triton head, cuBLAS


def kernel_events(fn, replays=REPLAYS):
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


def products(model) -> list[tuple[str, int]]:
    """(role, weight bytes) of each product of a decode step in the order it runs: per layer its mixer's input and
    output products (a DeltaNet's delta_in / delta_out, gated attention's qkvg / o, Qwen3's qkv / o), gate_up and
    down; then the vocabulary head."""
    out = []
    for layer in model.layers:
        m = getattr(layer, "mixer", layer)  # a Qwen3 layer holds its attention's weights itself
        mixer = (("delta_in", m.proj), ("delta_out", m.out)) if hasattr(m, "proj") else \
            (("qkvg", m.qkvg), ("o", m.o)) if hasattr(m, "qkvg") else (("qkv", m.qkv), ("o", m.o))
        out += [(role, w.numel() * w.element_size())
                for role, w in mixer + (("gate_up", layer.gate_up), ("down", layer.down))]
    return out + [("head", model.lm_head.numel() * model.lm_head.element_size())]


def by_name(events, made: list[tuple[str, int]], label: str, top: int = 20) -> None:
    """Kernels by name, per step: marginal µs, launches, share of the replay's span on the GPU; a replay's first
    kernel (the input copy) counts its own duration, not the host's gap before it. Where each replay runs one
    GEMM-like kernel per product, those are named by role, with the weight bytes they read and GB/s."""
    n = max(1, len(events) // REPLAYS)
    gemms = [i for i, e in enumerate(events) if any(g in e[2] for g in GEMM)]
    paired = len(gemms) == len(made) * REPLAYS and len(events) == n * REPLAYS
    product = {i: made[j % len(made)] for j, i in enumerate(gemms)} if paired else {}
    marg, count, nbytes, prev_end = defaultdict(float), defaultdict(int), defaultdict(int), 0.0
    for i, (start, end, name) in enumerate(events):
        first = i % n == 0
        key = f"{product[i][0]}: {name}"[:44] if i in product else name[:44]
        marg[key] += (end - start) if first else max(0.0, end - prev_end)
        prev_end = end if first else max(prev_end, end)
        count[key] += 1
        nbytes[key] += product[i][1] if i in product else 0
    span = sum(marg.values()) / REPLAYS
    print(f"\n{label}: {len(events) / REPLAYS:g} kernels, span {span:.0f} us per replay; products "
          + ("by role" if paired else f"by kernel name ({len(gemms) / REPLAYS:g} GEMM-like kernels per replay "
                                      f"for {len(made)} products)"))
    print(f"  {'kernel':44s} {'us/step':>8s} {'count':>5s} {'share':>6s} {'MB/step':>8s} {'GB/s':>6s}")
    rows = sorted(marg.items(), key=lambda kv: -kv[1])
    for key, us in rows[:top]:
        us, mb = us / REPLAYS, nbytes[key] / REPLAYS / 1e6
        reads = f"{mb:8.1f} {mb / us * 1e3 if us > 0 else 0:6.0f}" if mb else ""
        print(f"  {key:44s} {us:8.1f} {count[key] / REPLAYS:5.0f} {100 * us / span:5.1f}% {reads}".rstrip())
    if len(rows) > top:
        rest = sum(us for _, us in rows[top:]) / REPLAYS
        print(f"  {f'{len(rows) - top} other kernels':44s} {rest:8.1f} {'':5s} {100 * rest / span:5.1f}%")


def main():
    torch.manual_seed(0)
    try:
        model = random_target(MODEL, "cuda", torch.bfloat16, seed=0)
    except DflashError as e:
        sys.exit(f"error: {e}")
    _, _, graphs = prefilled_graphs(model, CTX)
    made = products(model)
    total = sum(b for _, b in made)
    hybrid = getattr(model, "recurrent", False)
    print(f"device {torch.cuda.get_device_name()}, {MODEL}: its products read {total / 1e9:.2f} GB per token")
    cases = [(f"decode ctx {c}", lambda c=c: graphs([5], c, (), False)) for c in (CTX, 8 * CTX)]
    if not hybrid:
        cases.append(("verify 16 rows ctx 1024", lambda: graphs(list(range(16)), CTX, (), True)))
    for label, fn in cases:
        if label.startswith("decode"):
            ms = replay_ms(fn)
            print(f"\n{label}: replay {ms:.3f} ms, {total / 1e9:.2f} GB / replay = {total / ms / 1e6:.0f} GB/s")
        events = kernel_events(fn)
        if hybrid:
            by_name(events, made, label)
        else:
            table(events, dict(made), label)


if __name__ == "__main__":
    main()
