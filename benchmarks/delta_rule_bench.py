"""GPU: the Gated DeltaNet kernels (kernels/delta_rule.py) against the torch reference they replace
(layers/delta_rule.py, RecurrentState.fold) at Qwen3.5-4B's shapes, every layer of a step in one CUDA graph.

python benchmarks/delta_rule_bench.py [--layers 24] [--rows 16] [--accepted 7] [--reps 50] [--model qwen3.5-4b]
                                      [--ctx 1024] [--json F]
python benchmarks/delta_rule_bench.py --device cpu --layers 2 --reps 2 --model qwen3.5-0.8b --ctx 32   # smoke run

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

Last, the rewind against the step it belongs to (issue 48: the rewind adds <= 3% to a verify): a random target of
--model (synthetic shapes), prefilled with --ctx tokens, its verify step of --rows rows as the engine replays it (held
forward, greedy verdict, the fold of the accepted rows inside), and its fold alone (all its DeltaNet layers, a graph of
its own), as a share of that step.

--device cpu: a smoke run of the torch path (no kernels, no check, no graphs: wall-clock µs of plain calls).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import replay_ms  # noqa: E402
from dflash_cli.errors import DflashError  # noqa: E402
from dflash_cli.layers import delta_rule, ops  # noqa: E402
from dflash_cli.layers.recurrent_state import RecurrentState  # noqa: E402
from dflash_cli.loading.config import Qwen35Config  # noqa: E402
from dflash_cli.synthetic import random_target, target_config  # noqa: E402

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
    ap.add_argument("--model", default="qwen3.5-4b", help="the synthetic hybrid target whose verify step the fold is "
                    "weighed against ('none': skip)")
    ap.add_argument("--ctx", type=int, default=1024, help="that verify's context (prompt tokens before it)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke run of the torch path")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    for name in ("layers", "k_heads", "v_heads", "dk", "dv", "reps", "ctx"):
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
    if args.model != "none":
        try:
            hybrid = isinstance(target_config(args.model), Qwen35Config)
        except DflashError as e:
            ap.error(str(e))
        if not hybrid:
            ap.error(f"--model {args.model} is not a hybrid target (no recurrent state to fold)")
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
        self.start = torch.zeros(1, dtype=torch.long, device=device)  # a graph's forward start: in device memory

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
            out["begin"] = lambda: self.state.begin(self.start)
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


def wall_us(fn, reps: int) -> float:
    """µs per plain call of fn (the CPU's smoke run), after a warm-up call."""
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e6 / reps


def calls_us(fn, reps: int) -> float:
    """µs per call of fn, which replays graphs of its own (a graph cannot capture their replays): CUDA events."""
    return replay_ms(fn, reps) * 1e3


def verify_share(a: argparse.Namespace, device: torch.device) -> dict:
    """The fold against the verify step it ends: a random target of the entry a.model (bf16), prefilled with a.ctx
    tokens; the step of a.rows rows as runtime/graphs replays it (greedy verdict and fold inside), the fold of all
    its DeltaNet layers after row a.accepted alone (a graph of its own). µs."""
    from dflash_cli.runtime.graphs import target_graphs

    model = random_target(a.model, device, torch.bfloat16)
    cache = model.new_cache(a.ctx + 64)
    model.forward(torch.randint(0, 1000, (a.ctx,), device=device), 0, cache)
    cuda = device.type == "cuda"
    graphs = target_graphs(model, cache, use_graphs=cuda)
    n = torch.tensor([a.accepted], device=device)
    verify = (calls_us if cuda else wall_us)(lambda: graphs(list(range(a.rows)), a.ctx, (), True, True), a.reps)
    fold = (graph_us if cuda else wall_us)(lambda: model.commit_rows(cache, n, a.rows), a.reps)
    return {"model": a.model, "ctx": a.ctx, "rows": a.rows, "deltanet_layers": cache.state.S.shape[0],
            "verify_us": verify, "fold_us": fold, "fold_share": fold / verify}


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
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU (--device cpu: a smoke run of the torch path)", file=sys.stderr)
        return 2
    m = Layers(args, device)
    if cuda and not ops.model_kernels(m.state.S, "delta_rule"):
        print("error: the Triton kernels are unavailable (triton missing, or the `kernels` knob is off)", file=sys.stderr)
        return 2
    timer = graph_us if cuda else wall_us
    state_bytes = m.state.S.numel() * 4
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "args": vars(args),
              "state_MiB": state_bytes / 2**20}
    head = f"{report['device']}: {args.layers} layers, S {state_bytes / 2**20:.0f} MiB"
    if cuda:
        errs = check(m, args.rows)
        report["check"] = errs
        print(f"{head}; check (rel. errors): " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
        # bf16 roundings may land on the other side (the conv's summation order, β = sigmoid(b) rounded to bf16 from
        # a slightly different exp): a bf16 step, ~4e-3, in a few values. A wrong kernel is off by far more.
        loose = {"conv": 1e-2, "norm": 1e-2, "rows_o": 1e-2, "rows_S": 1e-2, "kept_delta": 1e-2}
        bad = [k for k, v in errs.items() if not v <= loose.get(k, 1e-4)]
        if bad:
            print(f"error: the kernels disagree with the reference: {', '.join(bad)}", file=sys.stderr)
            return 1
    else:
        print(f"{head}; the torch path alone (wall clock, no kernels, no graphs)")
    copy = torch.empty_like(m.state.S)
    floor = timer(lambda: copy.copy_(m.state.S), args.reps)
    report["copy_state_us"] = floor
    print(f"copy of the state (read + write {2 * state_bytes / 2**20:.0f} MiB): {floor:.1f} us, "
          f"{2 * state_bytes / floor / 1e3:.0f} GB/s")
    moved = {("rows", False): 2, ("rows", True): 1, ("fold", True): 2, ("begin", False): 2, ("layer", False): 2,
             ("layer", True): 1, ("layer+fold", True): 3}  # state reads + writes, in units of the state's bytes
    print(f"{'step':8} {'part':11} {'torch us':>9} {'kernel us':>9} {'speedup':>7} {'GB/s':>6}")
    report["timings"] = []
    for label, t, hold in (("decode", 1, False), (f"verify{args.rows}", args.rows, True)):
        with ops.reference_only():
            times_ref = {name: timer(fn, args.reps) for name, fn in m.steps(t, hold).items()}
        times = {name: timer(fn, args.reps) for name, fn in m.steps(t, hold).items()} if cuda else {}
        for name, ref in times_ref.items():
            us = times.get(name)
            units = moved.get((name, hold))
            gbs = units * state_bytes / (us or ref) / 1e3 if units else None  # the kernel's (the CPU: torch's)
            print(f"{label:8} {name:11} {ref:9.1f} " + (f"{us:9.1f} {ref / us:6.1f}x" if us else f"{'-':>9} {'-':>7}")
                  + f" {'' if gbs is None else f'{gbs:6.0f}'}")
            report["timings"].append({"step": label, "part": name, "torch_us": ref, "kernel_us": us, "state_GBs": gbs})
    if args.model != "none":
        v = report["verify"] = verify_share(args, device)
        print(f"{args.model}: verify step of {args.rows} rows at ctx {args.ctx} {v['verify_us']:.1f} us (verdict and "
              f"fold inside); its fold alone ({v['deltanet_layers']} DeltaNet layers, n {args.accepted}) "
              f"{v['fold_us']:.1f} us = {100 * v['fold_share']:.1f}% of the step (issue 48: <= 3%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
