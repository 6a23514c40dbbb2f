"""GPU: one speculative (or plain) step between its graph replays, op by op, as the device ran it.

Runs forced-acceptance generations through the real driver on graphs (as the bench does), profiles one of
them, and groups the GPU's work by the host call that queued it: a graph replay is one group, every torch op
or copy outside a graph its own. For a few steps in the middle it prints each group in device order (what
queued it, kernels, busy time, the idle gap before it), then the mean step: time in graphs, in ops outside
them, and idle. That is where a step's time goes outside its graphs. MODES=dflash,eagle3,none picks the runs.
"""

import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import CTX, forced_decoder, generation_runner  # noqa: E402
from dflash_cli.synthetic import random_drafter, random_target  # noqa: E402

NEW = 128


def runner(model, kind):
    """A callable running one generation of NEW tokens after a CTX-token prompt, as the bench does."""
    from dflash_cli.runtime.generation import PlainDecoder
    from dflash_cli.runtime.drafters.dflash import DFlashProposer
    from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer

    if kind == "none":
        decoder = PlainDecoder()
    else:
        make = DFlashProposer if kind == "dflash" else Eagle3Proposer
        decoder = forced_decoder(model, make(random_drafter("qwen3-4b", kind, model)), 6.0, NEW)
    return generation_runner(model, decoder, NEW)


def groups(prof):
    """GPU work in device order, grouped by the host call that queued it: [(label, kernels, start, end)] (us)."""
    events = prof.profiler.kineto_results.events()
    cpu = [e for e in events if e.device_type() == torch.autograd.DeviceType.CPU]
    launch = {e.correlation_id(): e for e in cpu if e.name().startswith("cu")}
    ops = sorted((e for e in cpu if e.name().startswith("aten::")), key=lambda e: e.start_ns())

    def label(corr):
        call = launch.get(corr)
        if call is None:
            return "?"
        if "Graph" in call.name():
            return "graph"
        t, best = call.start_ns(), None
        for op in ops:  # the outermost aten op around the launch
            if op.start_ns() > t:
                break
            if op.end_ns() >= t and op.start_ns() <= t:
                best = best or op
        return best.name() if best is not None else call.name()

    gpu = sorted((e for e in events if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0),
                 key=lambda e: e.start_ns())
    out, cur = [], None
    for e in gpu:
        corr = e.correlation_id() or e.linked_correlation_id()  # the CUPTI id its launch call shares
        s, t = e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3
        if cur is not None and cur[0] == corr:
            cur[1] += 1
            cur[3] = max(cur[3], t)
            continue
        cur = [corr, 1, s, t]
        out.append(cur)
    return [(label(c), n, s, t) for c, n, s, t in out]


def show(kind, model):
    run = runner(model, kind)
    run()  # captures
    res = run()
    n = len(res.steps)
    print(f"\n== {kind}: {n} steps, wall {res.decode_s / n * 1000:.3f} ms/step, {res.decode_tok_per_s:.1f} tok/s")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
    gs = groups(prof)
    if os.environ.get("OUT"):  # every group, for a closer look off the device
        import json

        with open(os.path.join(os.environ["OUT"], f"timeline_{kind}.json"), "w") as f:
            json.dump(gs, f)
    # A step starts with its verify replay (plain: its decode replay): the graph groups with the most kernels.
    most = max(g[1] for g in gs)
    starts = [i for i, g in enumerate(gs) if g[0] == "graph" and g[1] > most // 2]
    steps = list(zip(starts, starts[1:]))[2:-2]  # steady state: no prefill, no last steps
    totals = defaultdict(float)
    for j, (a, b) in enumerate(steps):
        t0 = gs[a][2]
        if j < 2:
            print(f"  step {j}: label, kernels, start us, busy us, idle before us")
        prev_end = gs[a - 1][3]
        for label, k, s, t in gs[a:b]:
            gap = max(0.0, s - prev_end)
            prev_end = max(prev_end, t)
            kind_of = "graph" if label == "graph" else "ops"
            totals[kind_of] += t - s
            totals["idle"] += gap
            totals["count " + kind_of] += 1
            if j < 2:
                print(f"    {label[:34]:34s} {k:5d} {s - t0:9.1f} {t - s:9.1f} {gap:7.1f}")
        totals["step"] += gs[b][2] - t0
    m = max(len(steps), 1)
    print(f"  mean over {len(steps)} steps (us): step {totals['step'] / m:.1f} = graphs {totals['graph'] / m:.1f} "
          f"({totals['count graph'] / m:.1f} replays) + ops outside graphs {totals['ops'] / m:.1f} "
          f"({totals['count ops'] / m:.1f}) + idle {totals['idle'] / m:.1f}")


def main():
    torch.manual_seed(0)
    model = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    print(f"device {torch.cuda.get_device_name()}  ctx {CTX}")
    for kind in os.environ.get("MODES", "dflash,eagle3,none").split(","):
        show(kind, model)


if __name__ == "__main__":
    main()
