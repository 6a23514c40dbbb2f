"""Per-block timestamps of a step's kernels: a diagnostic, off unless the `block_trace` knob is on (tuning.py).

With it on, every traced launch (the CUDA GEMM, then built with -DTRACE=1; the attention split and merge; the
add + norm; the q/k norm + RoPE) gets a buffer of its own, one record per block: %globaltimer at the block's start,
after its wait for the previous kernel (programmatic dependent launch; the start where there is none) and at its
end, then its SM and its index. Launches inside a graph capture keep their buffers, so a replay rewrites them in place.
benchmarks/block_trace.py lays them out as a step's timeline: when each kernel's blocks were released and ended
against the end of the kernel before. Off, the kernels compile without it and no buffer is made."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import tuning

ON = tuning.KNOBS.block_trace  # at import: it decides how the kernels are built
FIELDS = 5  # start, after the wait, end (ns), SM, block index
_launches: list[tuple[str, torch.Tensor]] = []  # (kind, records [blocks, FIELDS]) in launch order
_retired: list[torch.Tensor] = []  # buffers `clear` dropped: a captured graph may still write them on replay


def buffer(kind: str, grid: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
    """A launch's record buffer, one row per block of `grid` (kept until `clear`), or None with tracing off."""
    if not ON:
        return None
    # Not zeroed here: inside a capture that would put a fill kernel before the launch. The reader zeroes them.
    records = torch.empty((math.prod(grid), FIELDS), dtype=torch.int64, device=device)
    _launches.append((kind, records))
    return records


def launches() -> list[tuple[str, torch.Tensor]]:
    """Every traced launch so far, in launch (capture) order."""
    return list(_launches)


def clear() -> None:
    """Forget the launches so far. Their buffers stay allocated: the graphs that captured them still write them, and
    freed, their memory could go to a later capture's tensors."""
    _retired.extend(rec for _, rec in _launches)
    _launches.clear()


@triton.jit
def now(TRACE: tl.constexpr):
    """%globaltimer (ns) where TRACE, else 0."""
    if TRACE:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tl.program_id(0)], dtype=tl.int64,
                                         is_pure=False, pack=1)
    else:
        return 0


@triton.jit
def record(rec_ptr, t0, t1, TRACE: tl.constexpr):
    """This program's record (start t0, after the wait t1, now, its SM, its index) where TRACE."""
    if TRACE:
        t2 = now(TRACE)
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [tl.program_id(0)], dtype=tl.int32,
                                       is_pure=False, pack=1)
        pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
        base = rec_ptr + pid.to(tl.int64) * 5
        tl.store(base, t0)
        tl.store(base + 1, t1)
        tl.store(base + 2, t2)
        tl.store(base + 3, sm.to(tl.int64))
        tl.store(base + 4, pid.to(tl.int64))


def args(kind: str, grid: tuple[int, ...], like: torch.Tensor) -> dict:
    """Keyword arguments of a traced Triton launch over `grid`: its buffer (any tensor with tracing off) and TRACE."""
    if not ON:
        return {"trace_ptr": like, "TRACE": False}
    return {"trace_ptr": buffer(kind, grid, like.device), "TRACE": True}
