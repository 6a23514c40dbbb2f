"""GPU: the Gated DeltaNet kernels (kernels/delta_rule.py) against the torch reference they replace
(layers/delta_rule.py, RecurrentState.fold) at Qwen3.5-4B's shapes, every layer of a step in one CUDA graph.

python benchmarks/delta_rule_bench.py [--layers 24] [--rows 16] [--accepted 7] [--reps 50] [--json F]

First a check on the GPU (bf16 activations like the model's, float32 state): the kernels' outputs, states, kept rows
and fold against the reference's (relative errors printed; it stops where one is off). Then, for the torch path and
the kernels, µs per step over all layers (a graph replay, CUDA events) of

  conv      the short conv + SiLU of the step's rows (window written, rows kept)
  rows      the delta rule's rows (decode: state written; verify: held, k, δ, g kept)
  norm      the output's gated RMSNorm
  layer     the three together: a DeltaNet mixer without its two products
  fold      after a held verify: the state after row n = --accepted (n in device memory)
  begin     RecurrentState.begin: the S -> S0 copy every forward makes today (its cost is the same on both paths)

with GB/s against the state bytes each must move (decode rows: read S0, write S; verify rows: read S0; fold: read S0,
write S; begin: read S, write S0), beside a plain copy of the state (the bandwidth floor).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.layers import delta_rule, ops  # noqa: E402
from dflash_cli.layers.recurrent_state import RecurrentState  # noqa: E402

MAX_ROWS = 32  # what a forward keeps (models/qwen35.MAX_KEPT_ROWS)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24, help="Gated DeltaNet layers (Qwen3.5-4B: 24)")
    ap.add_argument("--k-heads", type=int, default=16)
    ap.add_argument("--v-heads", type=int, default=32)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--kernel", type=int, default=4, help="conv width")
    ap.add_argument("--rows", type=int, default=16, help="rows of a verify (1..32)")
    ap.add_argument("--accepted", type=int, default=7, help="the fold's n (0..rows-1)")
    ap.add_argument("--reps", type=int, default=50, help="graph replays per timing")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    for name in ("layers", "k_heads", "v_heads", "dk", "dv", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.v_heads % args.k_heads:
        ap.error("--v-heads must be a multiple of --k-heads")
    if args.kernel < 2:
        ap.error("--kernel must be at least 2")
    if not 1 <= args.rows <= MAX_ROWS:
        ap.error(f"--rows must be in 1..{MAX_ROWS}")
    if not 0 <= args.accepted < args.rows:
        ap.error("--accepted must be in 0..rows-1")
    return args


class Layers:
    """Per-layer inputs as the model hands them over: the projection's output rows (conv input | z | b | a) in bf16,
    the conv weight, decay parameters and norm weight; a RecurrentState for all layers."""

    def __init__(self, a: argparse.Namespace, device):
        torch.manual_seed(0)
        bf = dict(dtype=torch.bfloat16, device=device)
        self.a, self.hk, self.hv, self.dk, self.dv = a, a.k_heads, a.v_heads, a.dk, a.dv
        self.C = 2 * a.k_heads * a.dk + a.v_heads * a.dv
        width = self.C + a.v_heads * a.dv + 2 * a.v_heads
        self.proj = [torch.randn(MAX_ROWS, width, **bf) for _ in range(a.layers)]
        self.conv_w = [0.5 * torch.randn(self.C, a.kernel, **bf) for _ in range(a.layers)]
        self.neg_a = [-torch.rand(a.v_heads, device=device) * 4 for _ in range(a.layers)]
        self.dt_bias = [torch.randn(a.v_heads, device=device) for _ in range(a.layers)]
        self.norm_w = [(1 + 0.1 * torch.randn(a.dv, device=device)).bfloat16() for _ in range(a.layers)]
        self.state = RecurrentState(a.layers, self.C, a.kernel, a.k_heads, a.v_heads, a.dk, a.dv, MAX_ROWS,
                                    torch.bfloat16, device)
        self.state.S.copy_(0.1 * torch.randn_like(self.state.S))
        self.state.conv.copy_(torch.randn_like(self.state.conv))
        self.state.begin(0)
        self.n = torch.tensor([a.accepted], device=device)

    def parts(self, layer: int, t: int):
        x, z, b, a = self.proj[layer][:t].split([self.C, self.hv * self.dv, self.hv, self.hv], dim=-1)
        return x, z.reshape(t, self.hv, self.dv), b, a

    def conv(self, layer: int, t: int, hold: bool) -> torch.Tensor:
        s = self.state
        x = self.parts(layer, t)[0]
        return delta_rule.short_conv(x, s.conv0[layer], self.conv_w[layer], None if hold else s.conv[layer],
                                     s.x[layer])

    def rows(self, layer: int, y: torch.Tensor, hold: bool, out_dtype=torch.bfloat16) -> torch.Tensor:
        s, t = self.state, y.shape[0]
        _, _, b, a = self.parts(layer, t)
        q, k, v = y.split([self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], dim=-1)
        q, k, v = q.reshape(t, self.hk, self.dk), k.reshape(t, self.hk, self.dk), v.reshape(t, self.hv, self.dv)
        return delta_rule.rows(q, k, v, a, b, self.neg_a[layer], self.dt_bias[layer], s.S0[layer],
                               None if hold else s.S[layer], keep=(s.k[layer], s.delta[layer], s.g[layer]),
                               out_dtype=out_dtype)

    def norm(self, layer: int, o: torch.Tensor) -> torch.Tensor:
        return delta_rule.gated_rms_norm(o, self.parts(layer, o.shape[0])[1], self.norm_w[layer], 1e-6)

    def steps(self, t: int, hold: bool) -> dict:
        """name -> a function running that part of a step over all layers."""
        L = range(self.a.layers)
        y = [self.conv(i, t, hold) for i in L]  # inputs for the parts timed alone
        o = [self.rows(i, y[i], hold) for i in L]
        out = {
            "conv": lambda: [self.conv(i, t, hold) for i in L],
            "rows": lambda: [self.rows(i, y[i], hold) for i in L],
            "norm": lambda: [self.norm(i, o[i]) for i in L],
            "layer": lambda: [self.norm(i, self.rows(i, self.conv(i, t, hold), hold)) for i in L],
        }
        if hold:
            out["fold"] = lambda: self.state.fold(self.n, t)
            out["layer+fold"] = lambda: (out["layer"](), self.state.fold(self.n, t))
        else:
            out["begin"] = self.state.begin
        return out


def graph_us(fn, reps: int) -> float:
    """µs per replay of a CUDA graph of fn (captured after a warm-up run, which compiles the kernels)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def check(m: Layers, t: int) -> dict:
    """Kernels against the reference on layer 0: rows from the same conv output (float32 o), the conv, the gated
    norm, the state and kept rows, and the fold of all layers. Relative errors."""
    s, errs = m.state, {}
    with ops.reference_only():
        y_ref = m.conv(0, t, hold=False).contiguous()  # (torch's conv leaves it transposed: the kernel wants rows)
        win_ref = s.conv[0].clone()
        o_ref = m.rows(0, y_ref, hold=False, out_dtype=torch.float32)
        S_ref, keep_ref = s.S[0].clone(), [x[0, :t].clone() for x in (s.k, s.delta, s.g)]
        n_ref = m.norm(0, o_ref.bfloat16())
    y = m.conv(0, t, hold=False)
    errs["conv"], errs["window"] = rel(y, y_ref), rel(s.conv[0], win_ref)
    o = m.rows(0, y_ref, hold=False, out_dtype=torch.float32)
    errs["rows_o"], errs["rows_S"] = rel(o, o_ref), rel(s.S[0], S_ref)
    errs["kept_k"], errs["kept_delta"], errs["kept_g"] = (rel(x[0, :t], w) for x, w in
                                                         zip((s.k, s.delta, s.g), keep_ref))
    errs["norm"] = rel(m.norm(0, o_ref.bfloat16()), n_ref)
    for i in range(m.a.layers):  # a held verify of every layer, then both folds
        m.rows(i, m.conv(i, t, hold=True), hold=True)
    with ops.reference_only():
        s.fold(m.n, t)
    S_ref, conv_ref = s.S.clone(), s.conv.clone()
    s.fold(m.n, t)
    errs["fold_S"], errs["fold_conv"] = rel(s.S, S_ref), rel(s.conv, conv_ref)
    return errs


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    m = Layers(args, device)
    if not ops.model_kernels(m.state.S, "delta_rule"):
        print("error: the Triton kernels are unavailable (triton missing, or the `kernels` knob is off)", file=sys.stderr)
        return 2
    state_bytes = m.state.S.numel() * 4
    report = {"device": torch.cuda.get_device_name(), "args": vars(args), "state_MiB": state_bytes / 2**20}
    errs = check(m, args.rows)
    report["check"] = errs
    print(f"{report['device']}: {args.layers} layers, S {state_bytes / 2**20:.0f} MiB; check (rel. errors): "
          + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    # bf16 roundings may land on the other side (the conv's summation order, β = sigmoid(b) rounded to bf16 from a
    # slightly different exp): a bf16 step, ~4e-3, in a few values. A wrong kernel is off by far more.
    loose = {"conv": 1e-2, "norm": 1e-2, "rows_o": 1e-2, "rows_S": 1e-2, "kept_delta": 1e-2}
    bad = [k for k, v in errs.items() if not v <= loose.get(k, 1e-4)]
    if bad:
        print(f"error: the kernels disagree with the reference: {', '.join(bad)}", file=sys.stderr)
        return 1
    copy = torch.empty_like(m.state.S)
    floor = graph_us(lambda: copy.copy_(m.state.S), args.reps)
    report["copy_state_us"] = floor
    print(f"copy of the state (read + write {2 * state_bytes / 2**20:.0f} MiB): {floor:.1f} us, "
          f"{2 * state_bytes / floor / 1e3:.0f} GB/s")
    moved = {("rows", False): 2, ("rows", True): 1, ("fold", True): 2, ("begin", False): 2, ("layer", False): 2,
             ("layer", True): 1, ("layer+fold", True): 3}  # state reads + writes, in units of the state's bytes
    print(f"{'step':8} {'part':11} {'torch us':>9} {'kernel us':>9} {'speedup':>7} {'GB/s':>6}")
    report["timings"] = []
    for label, t, hold in (("decode", 1, False), (f"verify{args.rows}", args.rows, True)):
        paths = {}
        with ops.reference_only():
            paths["torch"] = m.steps(t, hold)
            times_ref = {name: graph_us(fn, args.reps) for name, fn in paths["torch"].items()}
        fns = m.steps(t, hold)
        times = {name: graph_us(fn, args.reps) for name, fn in fns.items()}
        for name in fns:
            units = moved.get((name, hold))
            gbs = units * state_bytes / times[name] / 1e3 if units else None
            print(f"{label:8} {name:11} {times_ref[name]:9.1f} {times[name]:9.1f} {times_ref[name] / times[name]:6.1f}x"
                  f" {'' if gbs is None else f'{gbs:6.0f}'}")
            report["timings"].append({"step": label, "part": name, "torch_us": times_ref[name],
                                      "kernel_us": times[name], "state_GBs": gbs})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
