"""Greedy decisions on the device: the argmax of each row of logits, and a verified span's greedy verdict.

torch's argmax over a [17, 151936] float32 verify took 12 us on the H100 (one program per row) and the
acceptance after it six more kernels; here every row is cut into chunks that many programs reduce at once,
and one small program finishes the rows and, for a verify, the acceptance. Ties go to the first index, as
in torch; a NaN counts as the largest value, as in torch (an infinity before it would win here).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, start as pdl_start

CHUNK = 2048  # logits per program of the first pass


@triton.jit
def _chunk_max_kernel(x_ptr, stride_x, V, val_ptr, idx_ptr, CHUNKS, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row, c = tl.program_id(0), tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("inf"), x)
    i = tl.argmax(x, 0, tie_break_left=True)
    tl.store(val_ptr + row * CHUNKS + c, tl.max(x, 0))
    tl.store(idx_ptr + row * CHUNKS + c, c * BLOCK + i)


@triton.jit
def _finish_kernel(val_ptr, idx_ptr, ids_ptr, out_ptr, pos_ptr, fed_ptr, ROWS, CHUNKS, R: tl.constexpr,
                   C: tl.constexpr, VERDICT: tl.constexpr, FEED: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    inside = (r[:, None] < ROWS) & (c[None, :] < CHUNKS)
    v = tl.load(val_ptr + r[:, None] * CHUNKS + c[None, :], mask=inside, other=float("-inf"))
    ix = tl.load(idx_ptr + r[:, None] * CHUNKS + c[None, :], mask=inside, other=2147483647)
    top = tl.max(v, 1)
    best = tl.min(tl.where(v == top[:, None], ix, 2147483647), 1).to(tl.int64)  # first chunk among the maxima
    if VERDICT:
        # ids = [last, drafts...]: draft i agrees when it is row i's argmax; n = the agreeing prefix.
        k = ROWS - 1
        drafts = tl.load(ids_ptr + 1 + r, mask=r < k, other=-1)
        n = tl.min(tl.where((r < k) & (drafts != best), r, k), 0)
        bonus = tl.sum(tl.where(r == n, best, 0), 0)
        tl.store(out_ptr, n.to(tl.int64))
        tl.store(out_ptr + 1, bonus)
        tl.store(out_ptr + 2 + r, drafts, mask=r < k)
        if FEED:  # one row: its token becomes the next step's input, at the next position (ops.greedy_verdict)
            p = tl.load(pos_ptr)
            tl.store(ids_ptr, bonus)
            tl.store(pos_ptr, p + 1)
            tl.store(fed_ptr + p + 1, bonus)
    else:
        tl.store(out_ptr + r, best, mask=r < ROWS)


def _pow2(n: int) -> int:
    return max(2, triton.next_power_of_2(n))


def _finish(logits: torch.Tensor, ids: torch.Tensor | None, feed=None) -> torch.Tensor:
    """Both passes: the rows' argmax (ids None) or, for a verify's rows `ids`, its verdict (and its feed)."""
    rows, vocab = logits.shape
    chunks = triton.cdiv(vocab, CHUNK)
    vals = torch.empty((rows, chunks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((rows, chunks), dtype=torch.int32, device=logits.device)
    # Not launched early (programmatic dependent launch): its many programs would wait on SMs the vocabulary
    # head still needs (H100: a verify's graph took 45 us longer). It lets the finishing program launch early.
    _chunk_max_kernel[(rows, chunks)](logits, logits.stride(0), vocab, vals, idx, chunks, BLOCK=CHUNK,
                                      **launch_options(logits.device, allowed=False, trigger=True))
    verdict = ids is not None
    out = torch.empty(rows + 1 if verdict else rows, dtype=torch.long, device=logits.device)
    positions, fed = feed if feed is not None else (out, out)
    _finish_kernel[(1,)](vals, idx, ids if verdict else out, out, positions, fed, rows, chunks, R=_pow2(rows),
                         C=_pow2(chunks), VERDICT=verdict, FEED=feed is not None, **launch_options(logits.device))
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [rows, V] -> long [rows]: each row's first index of its largest value."""
    return _finish(logits, None)


def greedy_verdict(ids: torch.Tensor, logits: torch.Tensor, feed=None) -> torch.Tensor:
    """As ops.greedy_verdict: ids long [k+1], logits [k+1, V] -> long [2 + k]; feed (one row only) as there."""
    assert feed is None or logits.shape[0] == 1
    return _finish(logits, ids, feed)
