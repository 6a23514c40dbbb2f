"""Sampling on the device (runtime/sampling.py's top-k mode): a row's K largest logits, filtered and drawn, and the
rejection-sampling verdict of a verified span.

`filtered` is two kernels: every chunk of a row keeps its K largest, then one program per row keeps the row's K
largest of those, applies temperature / top-k / top-p as sampling.filtered does and, when asked, draws one (the
exponential race); `accept` is one program. On the H200 (docs/TUNING.md, "Sampling on the device") `filtered` beats
torch's topk and filter 3x at a draft head's 32,000 tokens and loses at a target's 151,936 (its row program sorts
8192 keys), so runtime/sampling.py uses it up to KERNEL_VOCAB; `accept` replaces about twenty kernels at any size.

A logit and its index travel as one int64 key ordered like (value, -index), so the chunks' and the rows' top-K are
plain integer top-K (tl.topk) and ties go to the lower index, as torch's argmax does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 2048  # logits per program of the first pass (74 programs a row over Qwen3's 151,936)
IDX_BITS = 20  # a key's low bits: the token's index (vocabularies up to 2^20)
LOWEST = -(1 << 62)  # below every key: padding past the vocabulary


@triton.jit
def _keys(x, idx, IDX_BITS: tl.constexpr):
    """float32 values and their int indices -> int64 keys ordered as (value, -index)."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # the float order as a signed integer's
    return (ordered.to(tl.int64) << IDX_BITS) | ((1 << IDX_BITS) - 1 - idx).to(tl.int64)


@triton.jit
def _chunk_top_kernel(x_ptr, stride_x, V, keys_ptr, CHUNKS, K: tl.constexpr, BLOCK: tl.constexpr,
                      IDX_BITS: tl.constexpr, LOWEST: tl.constexpr):
    row, c = tl.program_id(0), tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < V, other=0.0).to(tl.float32)
    keys = tl.where(offs < V, _keys(x, offs, IDX_BITS), LOWEST)
    tl.store(keys_ptr + (row * CHUNKS + c) * K + tl.arange(0, K), tl.topk(keys, K))


@triton.jit
def _row_filter_kernel(keys_ptr, N, temp_ptr, top_p_ptr, top_k_ptr, ids_ptr, probs_ptr, out_stride, noise_ptr,
                       map_ptr, tok_ptr, K: tl.constexpr, NP: tl.constexpr, IDX_BITS: tl.constexpr,
                       LOWEST: tl.constexpr, DRAW: tl.constexpr, MAP: tl.constexpr):
    row = tl.program_id(0)
    n = tl.arange(0, NP)
    keys = tl.load(keys_ptr + row * N + n, mask=n < N, other=LOWEST)
    top = tl.sort(tl.topk(keys, K), descending=True)
    idx = ((1 << IDX_BITS) - 1 - (top & ((1 << IDX_BITS) - 1))).to(tl.int64)
    ordered = (top >> IDX_BITS).to(tl.int32)
    value = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    if MAP:  # a draft head's index -> the target's token
        idx = tl.load(map_ptr + idx)
    # sampling.filtered: softmax(value / T) over the top_k largest, then the smallest prefix reaching top_p.
    rank = tl.arange(0, K)
    scores = tl.where(rank < tl.load(top_k_ptr), value / tl.load(temp_ptr), float("-inf"))
    e = tl.exp(scores - tl.max(scores, 0))
    p = e / tl.sum(e, 0)
    p = tl.where(tl.cumsum(p, 0) - p >= tl.load(top_p_ptr), 0.0, p)
    p = p / tl.sum(p, 0)
    tl.store(ids_ptr + row * out_stride + rank, idx)
    tl.store(probs_ptr + row * out_stride + rank, p)
    if DRAW:  # the exponential race on uniform noise: argmax(p / -log(1 - u)), a zero p never wins
        u = tl.load(noise_ptr + row * K + rank)
        race = p / tl.maximum(-tl.log(1.0 - u), 1.1754943508222875e-38)
        best = tl.argmax(race, 0, tie_break_left=True)
        tl.store(tok_ptr + row, tl.sum(tl.where(rank == best, idx, 0), 0))


def fits(logits: torch.Tensor, k: int) -> bool:
    """The kernels' shapes: [rows, V] with V in [k, 2^IDX_BITS], k a power of two, unit stride along V."""
    return (logits.dim() == 2 and logits.stride(-1) == 1 and k <= logits.shape[-1] <= (1 << IDX_BITS)
            and k == triton.next_power_of_2(k))


def filtered(logits: torch.Tensor, k: int, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
             ids: torch.Tensor, probs: torch.Tensor, draw: bool = False, to_target: torch.Tensor | None = None):
    """logits [R, V] -> ids [R, k] (long) and probs [R, k] (float32) written in place (rows of a wider buffer
    allowed), as sampling.filtered(..., TOP_K, ...) with K_MAX = k; to_target maps the ids (a draft head's).
    With draw: also one token per row, drawn from the rows (long [R]), else None."""
    rows, vocab = logits.shape
    assert ids.stride(0) == probs.stride(0) and ids.stride(1) == probs.stride(1) == 1
    chunks = triton.cdiv(vocab, CHUNK)
    keys = torch.empty((rows, chunks, k), dtype=torch.int64, device=logits.device)
    _chunk_top_kernel[(rows, chunks)](logits, logits.stride(0), vocab, keys, chunks, K=k, BLOCK=CHUNK,
                                      IDX_BITS=IDX_BITS, LOWEST=LOWEST)
    noise = torch.rand((rows, k), device=logits.device) if draw else keys
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device) if draw else keys
    _row_filter_kernel[(rows,)](keys, chunks * k, temperature, top_p, top_k, ids, probs, ids.stride(0), noise,
                                to_target if to_target is not None else keys, tokens, K=k,
                                NP=triton.next_power_of_2(chunks * k), IDX_BITS=IDX_BITS, LOWEST=LOWEST, DRAW=draw,
                                MAP=to_target is not None, num_warps=8)
    return tokens if draw else None


@triton.jit
def _accept_kernel(ids_ptr, k, q_ids_ptr, q_probs_ptr, q_stride, p_ids_ptr, p_probs_ptr, p_stride, noise_ptr,
                   out_ptr, R: tl.constexpr, K: tl.constexpr, W: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, K)
    w = tl.arange(0, W)
    drafting = r < k
    drafts = tl.load(ids_ptr + 1 + r, mask=drafting, other=-1)
    p_ids = tl.load(p_ids_ptr + r[:, None] * p_stride + c[None, :], mask=(r <= k)[:, None], other=-1)
    p = tl.load(p_probs_ptr + r[:, None] * p_stride + c[None, :], mask=(r <= k)[:, None], other=0.0)
    q_ids = tl.load(q_ids_ptr + r[:, None] * q_stride + w[None, :], mask=drafting[:, None], other=-2)
    q = tl.load(q_probs_ptr + r[:, None] * q_stride + w[None, :], mask=drafting[:, None], other=0.0)
    pd = tl.sum(tl.where(p_ids == drafts[:, None], p, 0.0), 1)
    qd = tl.sum(tl.where(q_ids == drafts[:, None], q, 0.0), 1)
    u = tl.load(noise_ptr + r, mask=drafting, other=1.0)
    n = tl.min(tl.where(drafting & (u * qd >= pd), r, k), 0)  # the first rejected draft (u < p/q accepts)
    # At row n: p minus q (q counts as zero when every draft passed), on p's candidates; drawn by the race.
    p_row_ids = tl.sum(tl.where(r[:, None] == n, p_ids, 0), 0)
    p_row = tl.sum(tl.where(r[:, None] == n, p, 0.0), 0)
    q_row_ids = tl.sum(tl.where(r[:, None] == n, q_ids, 0), 0)
    q_row = tl.sum(tl.where(r[:, None] == n, q, 0.0), 0)
    q_on_p = tl.sum(tl.where(p_row_ids[:, None] == q_row_ids[None, :], q_row[None, :], 0.0), 1)
    residual = tl.maximum(p_row - tl.where(n < k, q_on_p, 0.0), 0.0)
    weights = tl.where(tl.sum(residual, 0) > 0, residual, p_row)
    e = tl.load(noise_ptr + R + c)
    best = tl.argmax(weights / tl.maximum(-tl.log(1.0 - e), 1.1754943508222875e-38), 0, tie_break_left=True)
    tl.store(out_ptr, n.to(tl.int64))
    tl.store(out_ptr + 1, tl.sum(tl.where(c == best, p_row_ids, 0), 0).to(tl.int64))
    tl.store(out_ptr + 2 + r, drafts, mask=drafting)


def accept(ids: torch.Tensor, q_ids: torch.Tensor, q_probs: torch.Tensor, p_ids: torch.Tensor,
           p_probs: torch.Tensor) -> torch.Tensor:
    """sampling.accept as one program: ids [k+1] = [last, drafts...], q rows [>= k, W], p rows [k+1, K] ->
    long [2 + k] = [accepted drafts, the next token, drafts...]."""
    k = ids.shape[0] - 1
    # The kernel's strides: one per row for ids and probs, unit along a row (and along ids).
    assert q_ids.stride() == q_probs.stride() and p_ids.stride() == p_probs.stride()
    assert q_ids.stride(1) == p_ids.stride(1) == 1 and ids.is_contiguous()
    assert q_ids.shape[0] >= k and p_ids.shape[0] >= k + 1
    rows = max(2, triton.next_power_of_2(k + 1))
    width, q_width = p_ids.shape[1], q_ids.shape[1]
    noise = torch.rand(rows + width, device=ids.device)
    out = torch.empty(2 + k, dtype=torch.long, device=ids.device)
    _accept_kernel[(1,)](ids, k, q_ids, q_probs, q_ids.stride(0), p_ids, p_probs, p_ids.stride(0), noise, out,
                         R=rows, K=width, W=q_width, num_warps=4)
    return out
