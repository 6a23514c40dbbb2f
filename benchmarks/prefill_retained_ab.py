"""GPU: why plain decode runs ~0.5% slower in a process that holds prefill graphs (bench: 3.197 vs 3.180 ms a step).
One process, one session, a 1024-token prompt then 128 greedy plain decode steps (graphs), timed as the bench
times them, in phases: never a prefill graph (eager prefills); with the prefill graph captured and replayed; with
it dropped again (its pool memory released); captured again; dropped again. If the dropped phases recover, the
retained graph (its memory) is the cause, not the prefill kernel or the run of a graph prefill. CONTROL=1: the
same phases with every prefill eager (does decode drift over the process's life?). KERNEL=1: a phase after the
first that has run the prefill attention kernel once, outside any graph. Each phase prints the cyclic GC's runs and
time (GC=off disables it while a phase runs) and the decode step's graph replayed alone (device time)."""

import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.engine import graphs  # noqa: E402
from dflash_cli.engine.generation import PlainDecoder, Request, generate  # noqa: E402
from dflash_cli.engine.sampling import SamplingParams  # noqa: E402
from dflash_cli.engine.session import Session  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
s = Session(model, 1024 + 160, "graphs")
s.fast.prefill_capture_at_first_use = True
rows = 0 if os.environ.get("CONTROL") == "1" else graphs.PREFILL_MAX_ROWS
ids = torch.randint(0, model.cfg.vocab_size, (1024,), generator=torch.Generator().manual_seed(0)).tolist()


# Time the cyclic GC spends per phase (host pauses the decode loop may not hide). GC=off: no GC while timed.
gc_spent = {"s": 0.0, "n": 0, "t0": 0.0}


def on_gc(stage: str, info: dict) -> None:
    if stage == "start":
        gc_spent["t0"] = time.perf_counter()
    else:
        gc_spent["s"] += time.perf_counter() - gc_spent["t0"]
        gc_spent["n"] += 1


gc.callbacks.append(on_gc)


def phase(name: str, graph_prefill: bool, runs: int = 6) -> None:
    graphs.PREFILL_MAX_ROWS = rows if graph_prefill else 0
    t = []
    for i in range(runs + 1):
        if i == 1:  # after the untimed first run (a capture collects and re-enables the GC)
            gc_spent.update(s=0.0, n=0)
            if os.environ.get("GC") == "off":
                gc.disable()
        s.reset()
        r = generate(s, PlainDecoder(), Request(ids, SamplingParams(), max_tokens=128))
        if i:
            t.append(r.decode_s * 1e3)
    gc.enable()
    # Device time of the decode step alone: its graph replayed back to back (its KV writes land past the prompt).
    step = next(v for k, v in s.fast.steps.items() if k[0] == 1)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    step.graph.replay()
    begin.record()
    for _ in range(200):
        step.graph.replay()
    end.record()
    end.synchronize()
    replay = begin.elapsed_time(end) / 200
    held = sum(key[0] > graphs.MAX_ROWS for key in s.fast.steps)
    print(f"{name:<22} prefill graphs held {held}  reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB  "
          f"replay {replay:.4f} ms  decode {statistics.median(t):.2f} ms median ({' '.join(f'{x:.1f}' for x in t)})  "
          f"gc {gc_spent['n']} runs {gc_spent['s'] * 1e3:.1f} ms, {len(gc.get_objects())} objects", flush=True)


def drop() -> None:
    for key in [k for k in s.fast.steps if k[0] > graphs.MAX_ROWS]:
        del s.fast.steps[key]
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


phase("never captured", False)
if os.environ.get("KERNEL") == "1":  # the prefill attention kernel run once, outside any graph
    from dflash_cli.engine.kernels import prefill_attention

    q = torch.randn(1024, 32, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16)
    prefill_attention.attention_window(q, kv[0], kv[1], torch.arange(1024, device="cuda"), 128 ** -0.5)
    torch.cuda.synchronize()
    phase("prefill kernel run", False)
phase("captured", True)
drop()
phase("dropped", False)
phase("captured again", True)
drop()
phase("dropped again", False)
