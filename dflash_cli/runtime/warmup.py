"""Capture at load: every graph a session's generations can need, built before the first token.

A step's graph does not depend on where in the context it runs (runtime/graphs.py), so a short dummy generation
through the real decoder meets every step shape once: the short-prompt prefill, the first (unqueued) step, the
queued steps, the steps near max_tokens, greedy and sampled. Its cache rows are written again by the real
generations (the session starts over at length 0), and the drafter resets with the session.
"""

from __future__ import annotations

import gc
import hashlib
import time
from pathlib import Path

import torch

from .generation import Request, generate
from .graphs import MAX_ROWS, Totals
from .sampling import SamplingParams
from .session import Session

PROMPT = 8  # tokens of the dummy prompt: a short prompt's one padded prefill graph
# Steps of the dummy generation: the first (unqueued) step, queued ones, and the last ones (too near max_tokens to
# queue) all happen within three blocks.
BLOCKS = 3


def capture_all(session: Session, decoder, modes: list[SamplingParams]) -> tuple[int, float]:
    """Run the dummy generation once per sampling mode (greedy / sampled; their graphs differ), then give the session
    back empty. Returns (graphs captured, seconds). Nothing happens on the eager path (CPU, DFLASH_GRAPHS=0); the
    static path (tests) runs it uncaptured."""
    if session.fast is None:
        return 0, 0.0
    t0, (_, before, _) = time.perf_counter(), Totals.snapshot()
    gc.collect()  # graphs of dropped sessions (chat's /set draft) give their memory back before new ones are made
    if session.device.type == "cuda":
        torch.cuda.empty_cache()  # and the allocator's cached blocks, once a load (captures no longer do it each)
    block = getattr(decoder, "draft_len", 0) + 1
    tokens = min(BLOCKS * block + 2, session.max_len - MAX_ROWS - block - 1)  # clear of the cache's end
    if tokens >= 1:
        for params in modes:
            session.reset()
            dummy = SamplingParams(params.temperature, params.top_p, params.top_k, seed=0)
            generate(session, decoder, Request(list(range(1, PROMPT + 1)), dummy, tokens))
    session.reset()
    decoder.sync(session)
    session.prepared = (Totals.captures - before, time.perf_counter() - t0)
    return session.prepared


def prepare(session: Session, decoder, params: SamplingParams, switchable: bool = False, notice=None) -> None:
    """capture_all for the modes a command can run (modes_for), with `notice(text)` told first where this model and
    drafter's kernels compile for the first time (into Triton's and our caches: up to a minute instead of about a
    second); a marker file records that they did."""
    marker = _compiled_marker(session, decoder)
    first = marker is not None and not marker.is_file()
    if first and notice is not None:
        notice("compiling GPU kernels (first run only) …")
    capture_all(session, decoder, modes_for(params, switchable))
    if first:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # only the next run's notice depends on it


def modes_for(params: SamplingParams, switchable: bool) -> list[SamplingParams]:
    """The sampling modes to capture: the command's own, and both where it can change them (chat's /set)."""
    greedy = SamplingParams()
    if switchable:
        sampled = params if not params.greedy else SamplingParams(temperature=1.0)
        return [greedy, sampled]
    return [params]


def _compiled_marker(session: Session, decoder) -> Path | None:
    """The file whose presence says this model shape, drafter, device, software and kernel source have compiled
    their kernels here before (None off the graphs path)."""
    if session.fast is None or not session.fast.use_graphs:
        return None
    import triton

    from .. import tuning
    from ..kernels import cubin

    proposer = getattr(decoder, "proposer", None)
    what = [torch.__version__, triton.__version__, torch.cuda.get_device_name(session.device),
            repr(session.model.cfg), decoder.kind, repr(getattr(getattr(proposer, "model", None), "c", None))]
    digest = hashlib.sha256("\n".join(what).encode())
    sources = Path(__file__).parents[1] / "kernels", cubin.CSRC  # the kernels' code: an edit compiles them again
    for path in sorted(p for folder in sources if folder.is_dir() for p in folder.iterdir() if p.is_file()):
        digest.update(path.read_bytes())
    return tuning.KNOBS.kernel_cache / "compiled" / digest.hexdigest()[:16]
