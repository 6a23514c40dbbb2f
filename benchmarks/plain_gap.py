"""GPU: where a plain generation's step goes beyond its decode graph. Random Qwen3-4B shapes, bf16, CTX (default 8192).

The generation's wall per step (PlainDecoder through the real driver, as the bench runs it), then its decode graph
with what the driver queued around it before session 39 (input staging, the token's read-back, the step's mark)
replayed in a loop two ways: `free`, the host queuing every iteration at once, and `paced`, the host waiting each
iteration for the token it just asked for; `lean`, what it queues since (the replay, the mark, a side-stream read
after the mark; its paced form waits on its own replay, so only its free form times a step). Then profiles of the
generation and of the loops: the span of each decode graph on the device (its first kernel's start to its last
kernel's end) and the gap between two graphs; `position sweep` replays the graph at each of the generation's
positions in turn. A longer span says the graph itself runs slower there; a longer gap, that the work between graphs does.
"""

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import plain_session, replay_ms  # noqa: E402
from benchmarks.step_timeline import groups  # noqa: E402
from dflash_cli.runtime import graphs as graphs_module  # noqa: E402
from dflash_cli.runtime.generation import PlainDecoder, Request, generate  # noqa: E402
from dflash_cli.runtime.sampling import SamplingParams  # noqa: E402
from dflash_cli.runtime.session import mark, read_later  # noqa: E402

CTX = int(os.environ.get("CTX", "8192"))
NEW = 128


def walls(session, prompt: list[int], runs: int = 5) -> list[float]:
    """Sorted wall ms per step of `runs` generations (after one that captures)."""
    out = []
    for i in range(runs + 1):
        session.reset()
        res = generate(session, PlainDecoder(), Request(prompt, SamplingParams(), NEW))
        if i:
            out.append(res.decode_s / len(res.steps) * 1000)
    return sorted(out)


def spans_and_gaps(prof, trim: int = 2) -> tuple[list[float], list[float]]:
    """Decode graphs' spans and the gaps after them (us), in device order, from a profile, less `trim` at each end."""
    gs = groups(prof)
    most = max(g[1] for g in gs)
    graphs = [g for g in gs if g[0] == "graph" and g[1] > most // 2]
    spans = [t - s for _, _, s, t in graphs]
    gaps = [b[2] - a[3] for a, b in zip(graphs, graphs[1:])]
    return spans[trim:-trim], gaps[trim:-trim]


def describe(name: str, prof, each: bool = False) -> None:
    spans, gaps = spans_and_gaps(prof)
    if each:  # every span in device order, 16 a line
        for i in range(0, len(spans), 16):
            print(f"    {name} spans {i:3d}+: {' '.join(f'{x:.0f}' for x in spans[i:i + 16])}")
    print(f"  {name}: {len(spans)} graphs, span us median {statistics.median(spans):.1f} mean "
          f"{statistics.fmean(spans):.1f}; gap before the next median {statistics.median(gaps):.1f} mean "
          f"{statistics.fmean(gaps):.1f} (min {min(gaps):.1f}, max {max(gaps):.1f})")


def main():
    session, prompt = plain_session(NEW, CTX)
    dev = session.device
    print(f"device {torch.cuda.get_device_name()}  ctx {CTX}  window {session.max_len}")
    w = walls(session, prompt)
    print(f"generation wall ms/step median {w[len(w) // 2]:.4f} (all {' '.join(f'{x:.4f}' for x in w)})")
    decode = next(s for k, s in session.fast.steps.items() if k[0] == 1 and s.graph is not None)
    tok = decode.out.verdict[1:2]
    start = session.length

    def step():  # what PlainDecoder.step queued before session 39: the token's read-back, the next inputs, the
        # replay, the mark
        value = read_later(tok)
        graphs_module.stage_step(decode.ids, tok, decode.positions, start)
        decode.graph.replay()
        mark(dev)
        return value

    def paced():
        step()()

    side = torch.cuda.Stream(dev)
    host = torch.empty(1, dtype=torch.long, pin_memory=True)

    def lean():  # what PlainDecoder.step queues since session 39 (the graph feeds its own next inputs): the
        # replay and the mark, and the read-back on a side stream after that mark
        decode.graph.replay()
        end = mark(dev)
        side.wait_event(end)
        with torch.cuda.stream(side):
            host.copy_(tok, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(side)
        return copied.synchronize

    def lean_paced():
        lean()()

    for rnd in range(2):
        print(f"round {rnd}: graph alone {replay_ms(decode.graph.replay, 100):.4f} ms, free loop "
              f"{replay_ms(step, 100):.4f}, paced loop {replay_ms(paced, 100):.4f}; lean: free {replay_ms(lean, 100):.4f}, "
              f"paced {replay_ms(lean_paced, 100):.4f}")

    def profile(fn):
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return prof

    def generation():
        session.reset()
        generate(session, PlainDecoder(), Request(prompt, SamplingParams(), NEW))

    def loop(body):
        def run():
            for _ in range(NEW):
                body()
        return run

    print("profiled (us):")
    describe("generation", profile(generation), each=True)
    base = session.length - NEW

    def sweep():  # the decode graph at each of the generation's positions in turn, the host far ahead
        for p in range(base, base + NEW):
            graphs_module.stage_step(decode.ids, tok, decode.positions, p)
            decode.graph.replay()

    describe("position sweep", profile(sweep), each=True)
    describe("free loop", profile(loop(step)))
    describe("paced loop", profile(loop(paced)))
    describe("lean paced loop", profile(loop(lean_paced)))
    describe("graph alone", profile(loop(decode.graph.replay)))


if __name__ == "__main__":
    main()
