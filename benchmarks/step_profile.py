"""GPU: where a decode step's time goes. Random Qwen3-4B shapes, bf16, context 1024.

Times graph replays of the decode step (1 row) and a 16-row verify, and DFlash 2's draft step against DFlash's of the
same block (greedy and sampled, selector on and off, then DFlash 2's additions one by one), then profiles the same
static forwards run eagerly (kernel durations, not launch gaps) and the DFlash and DFlash 2 drafts, listing kernels by
total time per step.
Last, whole forced-acceptance DFlash and EAGLE-3 steps as the bench runs them (graphs): wall time per step against the
time the GPU is busy, so the host's share of a step (launches, the one sync, Python) is measured.
REPLAYS_ONLY=1 stops after the graph replays (for A/B runs of a switch); STEPS_ONLY=1 adds, after them, the wall
time per forced-acceptance DFlash step over six generations without the profiler (gpu_ab.sh STEPS=1).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.runtime.graphs import target_graphs  # noqa: E402
from dflash_cli.synthetic import random_drafter, random_target  # noqa: E402

CTX = int(os.environ.get("CTX", "1024"))


def print_resources():
    """RESOURCES=1: shared memory, registers and warps of every Triton kernel compiled so far (which kernels can
    share an SM with a GEMM block, and under which L1/shared split)."""
    from dflash_cli.kernels import attention, dflash2, elementwise, greedy
    from dflash_cli.kernels.carveout import compiled

    for name, kernel in compiled((attention, dflash2, elementwise, greedy)):
        md = kernel.metadata
        print(f"resources {name}: shared {md.shared} B, regs {kernel.n_regs}, warps {md.num_warps}")


def replay_ms(fn, reps=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def profiled(fn, runs: int, apart: bool = False):
    """The profiler over `runs` calls of fn after one warm-up call; apart: a sync after each call (else one at
    the end), so that each call's first kernel carries the host's gap."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
            if apart:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return prof


def profile(fn, steps, label):
    prof = profiled(fn, steps)
    rows = [(e.device_time_total / steps, e.count / steps, e.key) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\n{label}: kernels {total / 1000:.3f} ms per step, {sum(r[1] for r in rows):.0f} launches")
    for us, n, key in rows[:18]:
        print(f"  {us:8.1f} us  {n:5.0f}x  {us / n:6.1f} us/launch  {key[:90]}")


def gpu_intervals(prof) -> list[tuple[float, float, str]]:
    """(start, end, name) in microseconds of every GPU kernel and copy the profiler saw."""
    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and e.time_range.end > 0]


def prefilled_graphs(model, ctx: int, capture=()):
    """A cache with room for the ctx-8x decode timings, prefilled with `ctx` random tokens, and the model's graphs
    on it: (cache, prefill output, graphs)."""
    cache = model.new_cache(8 * ctx + 256)
    out = model.forward(torch.randint(0, 1000, (ctx,), device="cuda"), 0, cache, capture=capture)
    return cache, out, target_graphs(model, cache, use_graphs=True)


def busy_us(prof) -> tuple[float, float, list[float]]:
    """(union of GPU kernel/copy intervals, their span, the gaps between them) in microseconds."""
    spans = sorted((s, e) for s, e, _ in gpu_intervals(prof))
    if not spans:
        return 0.0, 1.0, []
    busy, gaps = 0.0, []
    cur_s, cur_e = spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return busy, spans[-1][1] - spans[0][0], gaps


def prompt_and_sequence(new: int, ctx: int | None = None) -> tuple[list[int], list[int]]:
    """The CTX-token (or ctx-token) prompt of the step runs, and it followed by the continuation forced acceptance
    commits."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 1000, (ctx or CTX,), generator=g).tolist()
    return prompt, prompt + torch.randint(0, 1000, (new + 64,), generator=g).tolist()


def forced_decoder(model, proposer, tau=6.0, new=128):
    """The bench's forced-acceptance decoder around `proposer` (EAGLE-3: the bench's chain of 7)."""
    from dflash_cli.bench.forced import ForcedAcceptance, ForcedDecoder

    draft_len = 7 if proposer.kind == "eagle3" else None
    return ForcedDecoder(ForcedAcceptance(proposer, prompt_and_sequence(new)[1], tau, model.cfg.vocab_size),
                         draft_len)


def plain_session(new: int, ctx: int | None = None):
    """(session, prompt) of the plain-generation scripts: the random Qwen3-4B-shaped target (bf16, seed 0) on CUDA,
    a graphs session sized for the ctx-token (default CTX) prompt plus `new` tokens, and that prompt."""
    from dflash_cli.runtime.session import Session

    torch.manual_seed(0)
    ctx = ctx or CTX
    model = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    return Session(model, ctx + new + 64, "graphs"), prompt_and_sequence(new, ctx)[0]


def generation_runner(model, decoder, new=128):
    """A callable running one greedy generation of `new` tokens after the CTX-token prompt through the real
    driver, on graphs (the first call captures)."""
    from dflash_cli.runtime.generation import Request, generate
    from dflash_cli.runtime.sampling import SamplingParams
    from dflash_cli.runtime.session import Session

    prompt = prompt_and_sequence(new)[0]
    session = Session(model, CTX + new + 64, "graphs")

    def run():
        session.reset()
        if hasattr(decoder, "proposer"):
            decoder.proposer.reset(session.max_len, session.path)
        return generate(session, decoder, Request(prompt, SamplingParams(), new))

    return run


def decode_steps(model, decoder, label, new=128):
    """Generations through the real driver on graphs: wall time per step against the time the GPU is busy."""
    run = generation_runner(model, decoder, new)
    run()  # captures
    res = run()
    n = len(res.steps)
    draft = sum(s.draft_s for s in res.steps) / n * 1000
    verify = sum(s.verify_s for s in res.steps) / n * 1000
    print(f"\n{label}: {n} steps, wall {res.decode_s / n * 1000:.3f} ms/step "
          f"(draft {draft:.3f}, verify+accept+absorb {verify:.3f}), {res.decode_tok_per_s:.1f} tok/s")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        res = run()
    busy, span, gaps = busy_us(prof)
    n = len(res.steps) + 1
    big = sorted(gaps, reverse=True)
    print(f"  profiled run: GPU busy {busy / n / 1000:.3f} of {span / n / 1000:.3f} ms per step "
          f"({100 * busy / span:.1f}%); idle gaps per step {len(gaps) / n:.1f}, "
          f"largest {', '.join(f'{x:.0f}' for x in big[:6])} us")
    rows = [(e.device_time_total / n, e.count / n, e.key) for e in prof.key_averages()
            if e.device_time_total > 0 and e.device_time_total / max(e.count, 1) < 200]
    rows.sort(reverse=True)
    print("  kernels per step (incl. graph nodes):")
    for us, c, key in rows[:14]:
        print(f"  {us:8.1f} us  {c:5.1f}x  {key[:90]}")


def step_walls(model, decoder, label, runs=6, new=128):
    """Wall ms per step of `runs` generations after the capturing one (no profiler): for A/B runs."""
    run = generation_runner(model, decoder, new)
    run()  # captures
    walls = []
    for _ in range(runs):
        res = run()
        walls.append(res.decode_s / len(res.steps) * 1000)
    walls.sort()
    print(f"{label}: wall ms/step over {runs} runs: median {walls[runs // 2]:.3f}, "
          f"all {' '.join(f'{w:.3f}' for w in walls)}")


def spec_steps(model, proposer, label, tau=6.0, new=128):
    """Forced-acceptance generations through the real driver, on graphs."""
    decode_steps(model, forced_decoder(model, proposer, tau, new), f"{label} steps (graphs, forced tau {tau})", new)


def graph_ms(fn, count: int = 1) -> float:
    """ms per replay of a CUDA graph of `count` calls of fn (a warm-up call on a side stream first: compiles)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(count):
            fn()
    return replay_ms(g.replay)


def dflash2_pieces(d2, added: float):
    """DFlash 2's additions to a draft step one by one at the drafter's shapes (its block's rows), each a CUDA graph
    of as many calls as a step makes, against `added` ms (the replays' greedy DFlash 2 - DFlash)."""
    from dflash_cli.layers import ops
    from dflash_cli.models.dflash2 import CandidateSelector, convolve
    from dflash_cli.runtime import sampling

    c, m, sel = d2.c, d2.cfg, d2.selector
    dev, dt = sel.projection.device, sel.projection.dtype
    rows, hidden, subs, eps = d2.block_size, m.hidden_size, 2 * m.num_hidden_layers, m.rms_norm_eps
    x = torch.randn(rows, hidden, device=dev).to(dt)
    conv, norm = d2.convs[0][0], d2.layers[0].post_norm
    delta = ops.linear(x, conv.projection).view(rows, 2, c.kernel_size, -1)
    logits = d2.normed_logits(x[1:])
    anchor = torch.tensor([5], device=dev)
    candidates, scores = sel.scores(x[1:], logits, anchor)
    temperature = sampling.sampler(dev).temperature  # sampling.begin set it (0.7)
    # the draws as the proposer's (race's default generator): the kernel's noise at once, the torch walk's row by row
    draw, noise = (lambda q: sampling.race(q, None)), (lambda shape: sampling.race_noise(shape, dev, None))
    pieces = (  # (label, calls per step, the call, whether a greedy step's sum counts it)
        (f"conv corrections: {subs} x product [{rows}, {hidden}] -> {delta[0].numel()}", subs,
         lambda: ops.linear(x, conv.projection), True),
        (f"input convs ({c.kernel_size} taps, {c.groups} groups): {subs} x", subs,
         lambda: convolve(x, delta[:, 0], conv.base[0]), True),
        (f"output convs + residual add + next norm: {subs} x", subs,
         lambda: conv.finish(x, delta[:, 1], x, norm, eps), True),
        ("the first layer's norm (unfolded)", 1, lambda: ops.rms_norm(x, norm, eps), True),
        (f"selector scores: top-{sel.top_k}, projection to rank {sel.projection.shape[0]}, the product", 1,
         lambda: sel.scores(x[1:], logits, anchor), True),
        (f"  of which the top-{sel.top_k} of [{rows - 1}, {logits.shape[1]}] logits", 1,
         lambda: torch.topk(logits, sel.top_k, dim=-1), False),
        ("selector walk, greedy", 1, lambda: CandidateSelector.walk(candidates, scores), True),
        ("selector walk, sampled (its noise drawn)", 1,
         lambda: CandidateSelector.walk(candidates, scores, temperature, draw, noise), False),
    )
    print(f"DFlash 2's additions alone (CUDA graphs, a step's calls, {rows} rows, H {hidden}):")
    greedy = 0.0
    for label, count, fn, summed in pieces:
        ms = graph_ms(fn, count)
        greedy += ms if summed else 0.0
        print(f"  {ms * 1000:7.1f} us  {label}")
    print(f"  {greedy * 1000:7.1f} us  the greedy step's pieces together; DFlash 2 - DFlash in the replays: "
          f"{added * 1000:.1f} us")


def same_block_dflash(model, block: int):
    """A random DFlash drafter of Qwen3-4B's published depth and taps with DFlash 2's block (issue 46's base)."""
    from pathlib import Path

    from dflash_cli.models.dflash import DFlashConfig, DFlashDrafter, checkpoint_shapes
    from dflash_cli.synthetic import random_tensors, shipped_configs

    c = DFlashConfig(dict(shipped_configs("qwen3-4b")["dflash"], block_size=block), Path(f"<DFlash, block {block}>"))
    return DFlashDrafter(c, random_tensors(checkpoint_shapes(c), model.device, model.dtype, 1), model)


def dflash2_draft_costs(model, hidden, dflash, eager=False):
    """DFlash 2's draft step against DFlash's of the same block and depth (issue 46: within 1.15x), and against
    the engine's DFlash drafter of block 16 keeping as many drafts, as graph replays of the proposers' steps:
    greedy (DFlash: its logits' argmax after the graph) and sampled at T = 0.7 (drafts drawn, q rows written), DFlash 2 with its candidate selector and without (its convolutions alone);
    then its additions one by one (dflash2_pieces).
    eager: also the kernels of each DFlash 2 step run eagerly on the static path (launches per step)."""
    from dflash_cli.runtime import sampling
    from dflash_cli.runtime.drafters.dflash import DFlashProposer
    from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
    from dflash_cli.runtime.sampling import SamplingParams

    d2 = random_drafter("qwen3-4b", "dflash2", model)
    k = d2.block_size - 1
    same = same_block_dflash(model, d2.block_size)
    greedy, hot = SamplingParams(), SamplingParams(temperature=0.7)
    sampling.begin(hot, model.device)

    def proposer(drafter, selector=True, path="graphs"):
        d2.use_selector = selector
        run = DFlash2Proposer(d2) if drafter is d2 else DFlashProposer(drafter)
        run.reset(CTX + 256, path)
        run.absorb(hidden, 0)
        return run

    # The base is DFlash's draft of the same depth and block; the engine's DFlash drafter (block 16) drafts
    # its whole block whatever the drafts a step keeps (runtime/drafters/dflash.py), so it is timed too.
    cases = (("DFlash", same, True), (f"DFlash, block {dflash.block_size}", dflash, True),
             ("DFlash 2", d2, True), ("DFlash 2, selector off", d2, False))
    times = {}
    for label, drafter, selector in cases:
        run = proposer(drafter, selector)
        times[label] = [replay_ms(lambda: run.propose(5, k, params)) for params in (greedy, hot)]
        base = times["DFlash"]
        print(f"graph replay: {label} draft of {k} rows: greedy {times[label][0]:.3f} ms "
              f"({times[label][0] / base[0]:.2f}x DFlash), sampled {times[label][1]:.3f} ms "
              f"({times[label][1] / base[1]:.2f}x DFlash)")
    on, off, base = times["DFlash 2"], times["DFlash 2, selector off"], times["DFlash"]
    print(f"DFlash 2 over DFlash: greedy {on[0] - base[0]:+.3f} ms (the selector {on[0] - off[0]:+.3f}, the rest "
          f"{off[0] - base[0]:+.3f}), sampled {on[1] - base[1]:+.3f} ms (the selector {on[1] - off[1]:+.3f}, the rest "
          f"{off[1] - base[1]:+.3f}); issue 46: within 1.15x")
    d2.use_selector = True
    dflash2_pieces(d2, on[0] - base[0])
    if eager:
        for params, mode in ((greedy, "greedy"), (hot, "sampled")):
            run = proposer(d2, path="static")
            profile(lambda: run.propose(5, k, params), 5, f"DFlash 2 draft, {mode} (eager static)")


def main():
    torch.manual_seed(0)
    model = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    drafter = random_drafter("qwen3-4b", "dflash", model)
    cache, out, graphs = prefilled_graphs(model, CTX, drafter.capture)
    static = target_graphs(model, cache, use_graphs=False)
    # Greedy graphs as the engine runs them: the decode's argmax and the verify's acceptance inside (accept).
    one = lambda: graphs([5], CTX, (), False, True)  # noqa: E731
    span = lambda: graphs(list(range(16)), CTX, drafter.capture, True, True)  # noqa: E731
    print(f"device {torch.cuda.get_device_name()}  ctx {CTX}")
    span8 = lambda: graphs(list(range(8)), CTX, drafter.capture, True, True)  # noqa: E731  (EAGLE-3's chain of 7)
    print(f"graph replay: decode {replay_ms(one):.3f} ms, verify 16 rows {replay_ms(span):.3f} ms, "
          f"verify 8 rows {replay_ms(span8):.3f} ms")
    print(f"graph replay: decode at ctx {8 * CTX}: {replay_ms(lambda: graphs([5], 8 * CTX, (), False, True)):.3f} ms, "
          f"verify 8 rows {replay_ms(lambda: graphs(list(range(8)), 8 * CTX, drafter.capture, True, True)):.3f} ms, "
          f"verify 16 rows {replay_ms(lambda: graphs(list(range(16)), 8 * CTX, drafter.capture, True, True)):.3f} ms")
    from dflash_cli.runtime.drafters.dflash import DFlashProposer

    run = DFlashProposer(drafter)
    run.reset(CTX + 256, "graphs")
    run.absorb(out.hidden, 0)
    draft = lambda: run.draft_logits(5, 15)  # noqa: E731
    print(f"graph replay: DFlash draft {replay_ms(draft):.3f} ms")
    dflash2_draft_costs(model, out.hidden, drafter, eager=os.environ.get("REPLAYS_ONLY") != "1")
    if os.environ.get("RESOURCES") == "1":
        print_resources()
    if os.environ.get("STEPS_ONLY") == "1":  # A/B runs of the step's work outside the graphs
        step_walls(model, forced_decoder(model, DFlashProposer(drafter)), "DFlash steps (graphs, forced tau 6.0)")
    if os.environ.get("REPLAYS_ONLY") == "1":  # A/B runs of a switch: the replays are the figures
        return
    profile(lambda: static([5], CTX, (), False), 5, "decode step (eager static)")
    profile(lambda: static(list(range(16)), CTX, drafter.capture, True), 5, "verify 16 rows (eager static)")
    run.reset(CTX + 256, "static")
    run.absorb(out.hidden, 0)
    profile(draft, 5, "DFlash draft (eager static)")
    from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
    from dflash_cli.runtime.generation import PlainDecoder

    decode_steps(model, PlainDecoder(), "plain steps (graphs, queue-ahead)")
    spec_steps(model, DFlashProposer(drafter), "DFlash")
    spec_steps(model, Eagle3Proposer(random_drafter("qwen3-4b", "eagle3", model)), "EAGLE-3")


if __name__ == "__main__":
    main()
