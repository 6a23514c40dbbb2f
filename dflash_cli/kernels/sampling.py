"""Sampling on the device (runtime/sampling.py's top-k mode): a row's K largest logits, filtered and drawn, and the
block-verification verdict of a verified span; and a plain exact top-K (`top_k`, DFlash 2's candidate selector).

A row's K largest are a tree of small programs. Every chunk of CHUNK logits keeps its K largest, sorted: only those
at or above a floor taken from its groups' maxima can be among them (about 1.4 K in random order), so the chunk's
top-K (tl.topk) is of 4 K keys, not CHUNK (where more reach the floor, of the whole chunk: exact either way). Then
programs of at most MERGE_KEYS keys merge groups of those sorted lists into one (the bitonic top-k's merge: the
larger of paired ranks of a list and a reversed one is a bitonic list of the pair's K largest, sorted by log2(K)
compare-and-swap stages), until one program a row merges the rest and filters (temperature / top-k / top-p as
sampling.filtered does, and when asked draws one: the exponential race) or writes the values and ids: two kernels
at a draft head's 32,000 tokens, three at a target's 151,936 or 248,320. The first version's row program ran a
top-k over all chunks' keys (8192 at 151,936) and lost to torch there (docs/TUNING.md, "Sampling on the device").
`accept`, the block verification of a verified span, is one program.

A logit and its index travel as one int64 key ordered like (value, -index), so every top-K is a plain integer
top-K and ties go to the lower index, as torch's argmax does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, start as pdl_start

CHUNK = 8192  # logits per program of the first pass, 8 warps (19 programs a row over Qwen3's 151,936): docs/TUNING.md
MERGE_KEYS = 512  # keys per program of a merge: MERGE_KEYS // K chunks' lists (8 at K = 64): docs/TUNING.md
K_LIMIT = 256  # the largest K the kernels take (a merge holds at least two lists)
IDX_BITS = 20  # a key's low bits: the token's index (vocabularies up to 2^20)
LOWEST = -(1 << 62)  # below every key: padding past the vocabulary
# The race's noise is -log(u), u = 0 counted as its bucket's middle (runtime/sampling.race_noise's rule): never 0,
# whose candidate would win whatever its weight.
U_FLOOR = tl.constexpr(2.0 ** -25)
TINY = tl.constexpr(torch.finfo(torch.float32).tiny)  # sampling.block_weights' floor of a divisor


@triton.jit
def _ordered(x):
    """float32 values -> int32 with the floats' order."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _keys(ordered, idx, IDX_BITS: tl.constexpr):
    """_ordered values and their indices -> int64 keys ordered as (value, -index)."""
    return (ordered.to(tl.int64) << IDX_BITS) | ((1 << IDX_BITS) - 1 - idx).to(tl.int64)


@triton.jit
def _decode(keys, IDX_BITS: tl.constexpr):
    """int64 keys -> (float32 values, int64 indices)."""
    idx = ((1 << IDX_BITS) - 1 - (keys & ((1 << IDX_BITS) - 1))).to(tl.int64)
    ordered = (keys >> IDX_BITS).to(tl.int32)
    return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True), idx


@triton.jit
def _chunk_top_kernel(x_ptr, stride_x, V, keys_ptr, near_ptr, CHUNKS, K: tl.constexpr, BLOCK: tl.constexpr,
                      GROUPS: tl.constexpr, NEAR: tl.constexpr, IDX_BITS: tl.constexpr, LOWEST: tl.constexpr,
                      PDL: tl.constexpr):
    pdl_start(PDL)
    row, c = tl.program_id(0), tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    inside = offs < V
    x = tl.load(x_ptr + row * stride_x + offs, mask=inside, other=0.0).to(tl.float32)
    ordered = tl.where(inside, _ordered(x), -(1 << 31))
    if BLOCK > NEAR:
        # A floor under the chunk's K-th largest: the K-th largest of its GROUPS groups' maxima (K logits reach
        # it). Only the logits at or above it can be among the K largest: about 1.4 K of them in random order, so
        # they are packed in order into NEAR places and the top-K is NEAR keys' instead of BLOCK's (unless more
        # reach the floor: the whole chunk's then). Groups are strided (logit i in group i % GROUPS), so that a
        # row's last, partial chunk has every group filled: contiguous ones left it fewer than K, a floor of -inf
        # and the whole chunk's sort (the slowest program of the launch).
        floor = tl.min(tl.topk(tl.max(tl.reshape(ordered, [BLOCK // GROUPS, GROUPS]), 0), K), 0)
        near = inside & (ordered >= floor)
        count = tl.sum(near.to(tl.int32), 0)
        if count <= NEAR:
            packed = near_ptr + (row * CHUNKS + c) * NEAR
            tl.store(packed + tl.cumsum(near.to(tl.int32), 0) - 1, _keys(ordered, offs, IDX_BITS), mask=near)
            tl.debug_barrier()  # the program's stores seen by all its threads
            n = tl.arange(0, NEAR)
            top = tl.topk(tl.load(packed + n, mask=n < count, other=LOWEST), K)
        else:
            top = tl.topk(tl.where(inside, _keys(ordered, offs, IDX_BITS), LOWEST), K)
    else:
        top = tl.topk(tl.where(inside, _keys(ordered, offs, IDX_BITS), LOWEST), K)
    tl.store(keys_ptr + (row * CHUNKS + c) * K + tl.arange(0, K), top)


@triton.jit
def _indicator(n_dims: tl.constexpr, j: tl.constexpr):
    """0, 1 along the hypercube's j-th innermost dimension."""
    return tl.reshape(tl.arange(0, 2), [1] * (n_dims - j - 1) + [2] + [1] * j)


@triton.jit
def _load_lists(keys_ptr, row, first, N, K: tl.constexpr, G: tl.constexpr, LOWEST: tl.constexpr):
    """A row's sorted lists first .. first + G of N (descending in memory) as [G, K], the even ones reversed."""
    j = tl.arange(0, G)[:, None]
    n = tl.arange(0, K)[None, :]
    at = first + j
    rank = tl.where(j % 2 == 0, K - 1 - n, n)
    return tl.load(keys_ptr + (row * N + at) * K + rank, mask=(at < N) & (n < K), other=LOWEST)


@triton.jit
def _merge(h, LOG_G: tl.constexpr, LOG_K: tl.constexpr):
    """h [G, K]: sorted lists, the even ones ascending, the odd ones descending -> their K largest, descending [K].
    Per level: the larger of each pair's ranks (a bitonic list of the pair's K largest), then log2(K) compare-and-
    swap stages sort it, ascending and descending in turn so that the next level's pairs are bitonic too."""
    for level in tl.static_range(LOG_G):
        h = tl.max(tl.reshape(h, [2] * (LOG_G - level + LOG_K)), axis=LOG_G - level - 1)
        h = _sort_bitonic(h, LOG_G - level - 1 + LOG_K, LOG_K, level == LOG_G - 1)
    return tl.reshape(h, [2**LOG_K])


@triton.jit
def _sort_bitonic(h, N_DIMS: tl.constexpr, LOG_K: tl.constexpr, LAST: tl.constexpr):
    """h: a hypercube [2] * N_DIMS of bitonic lists of 2^LOG_K -> each sorted, descending if LAST, else ascending
    and descending in turn."""
    for s in tl.static_range(LOG_K):  # partners 2^(LOG_K - 1 - s) apart
        partner = h ^ tl.xor_sum(h, N_DIMS - LOG_K + s, keep_dims=True)
        if LAST:
            swap = (h > partner) != (1 ^ _indicator(N_DIMS, LOG_K - 1 - s)).to(tl.int1)
        else:
            swap = (h > partner) != (_indicator(N_DIMS, LOG_K) ^ _indicator(N_DIMS, LOG_K - 1 - s)).to(tl.int1)
        h = tl.where(swap, partner, h)
    return h


@triton.jit
def _merge_kernel(src_ptr, N, dst_ptr, M, K: tl.constexpr, LOG_K: tl.constexpr, G: tl.constexpr,
                  LOG_G: tl.constexpr, LOWEST: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row, g = tl.program_id(0), tl.program_id(1)
    top = _merge(_load_lists(src_ptr, row, g * G, N, K, G, LOWEST), LOG_G, LOG_K)
    tl.store(dst_ptr + (row * M + g) * K + tl.arange(0, K), top)


def _lists(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, int, int]:
    """logits [R, V] -> (keys [R, n, k]: n sorted lists holding the rows' k largest, n, lists per final program)."""
    rows, vocab = logits.shape
    chunks = triton.cdiv(vocab, CHUNK)
    keys = torch.empty((rows, chunks, k), dtype=torch.int64, device=logits.device)
    near = min(4 * k, CHUNK)
    packed = torch.empty((rows, chunks, near), dtype=torch.int64, device=logits.device)
    # The floor's groups: two per K (~1.4 K logits reach it, whatever CHUNK); 512 logits a warp, at most 8 warps.
    _chunk_top_kernel[(rows, chunks)](logits, logits.stride(0), vocab, keys, packed, chunks, K=k, BLOCK=CHUNK,
                                      GROUPS=min(2 * k, CHUNK), NEAR=near, IDX_BITS=IDX_BITS, LOWEST=LOWEST,
                                      num_warps=max(1, min(8, CHUNK // 512)), **launch_options(logits.device))
    per = max(2, MERGE_KEYS // k)  # lists a merge program holds
    while chunks > per:
        groups = triton.cdiv(chunks, per)
        merged = torch.empty((rows, groups, k), dtype=torch.int64, device=logits.device)
        _merge_kernel[(rows, groups)](keys, chunks, merged, groups, K=k, LOG_K=_log2(k), G=per, LOG_G=_log2(per),
                                      LOWEST=LOWEST, **launch_options(logits.device))
        keys, chunks = merged, groups
    return keys, chunks, max(2, triton.next_power_of_2(chunks))


def _log2(n: int) -> int:
    return n.bit_length() - 1


@triton.jit
def _row_filter_kernel(keys_ptr, N, temp_ptr, top_p_ptr, top_k_ptr, ids_ptr, probs_ptr, out_stride, noise_ptr,
                       map_ptr, tok_ptr, K: tl.constexpr, LOG_K: tl.constexpr, G: tl.constexpr, LOG_G: tl.constexpr,
                       IDX_BITS: tl.constexpr, LOWEST: tl.constexpr, DRAW: tl.constexpr, MAP: tl.constexpr,
                       PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0)
    value, idx = _decode(_merge(_load_lists(keys_ptr, row, 0, N, K, G, LOWEST), LOG_G, LOG_K), IDX_BITS)
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
    if DRAW:  # the exponential race on uniform noise: argmax(p / -log(u)), a zero p never wins
        u = tl.load(noise_ptr + row * K + rank)
        race = p / -tl.log(tl.maximum(u, U_FLOOR))
        best = tl.argmax(race, 0, tie_break_left=True)
        tl.store(tok_ptr + row, tl.sum(tl.where(rank == best, idx, 0), 0))


@triton.jit
def _row_top_kernel(keys_ptr, N, values_ptr, ids_ptr, k, K: tl.constexpr, LOG_K: tl.constexpr, G: tl.constexpr,
                    LOG_G: tl.constexpr, IDX_BITS: tl.constexpr, LOWEST: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0)
    value, idx = _decode(_merge(_load_lists(keys_ptr, row, 0, N, K, G, LOWEST), LOG_G, LOG_K), IDX_BITS)
    rank = tl.arange(0, K)
    tl.store(values_ptr + row * k + rank, value.to(values_ptr.dtype.element_ty), mask=rank < k)
    tl.store(ids_ptr + row * k + rank, idx, mask=rank < k)


def fits(logits: torch.Tensor, k: int) -> bool:
    """`filtered`'s shapes: [rows, V] with V in [k, 2^IDX_BITS], k a power of two in [2, K_LIMIT], unit stride along
    V."""
    return top_k_fits(logits, k) and k >= 2 and k == triton.next_power_of_2(k)


def top_k_fits(logits: torch.Tensor, k: int) -> bool:
    """`top_k`'s shapes: [rows, V] with V in [k, 2^IDX_BITS], 1 <= k <= K_LIMIT, unit stride along V."""
    return (logits.dim() == 2 and logits.stride(-1) == 1 and 1 <= k <= logits.shape[-1] <= (1 << IDX_BITS)
            and k <= K_LIMIT)


def filtered(logits: torch.Tensor, k: int, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
             ids: torch.Tensor, probs: torch.Tensor, draw: bool = False, to_target: torch.Tensor | None = None):
    """logits [R, V] -> ids [R, k] (long) and probs [R, k] (float32) written in place (rows of a wider buffer
    allowed), as sampling.filtered(..., TOP_K, ...) with K_MAX = k; to_target maps the ids (a draft head's).
    With draw: also one token per row, drawn from the rows (long [R]), else None."""
    rows = logits.shape[0]
    assert ids.stride(0) == probs.stride(0) and ids.stride(1) == probs.stride(1) == 1
    keys, n, g = _lists(logits, k)
    noise = torch.rand((rows, k), device=logits.device) if draw else keys
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device) if draw else keys
    _row_filter_kernel[(rows,)](keys, n, temperature, top_p, top_k, ids, probs, ids.stride(0), noise,
                                to_target if to_target is not None else keys, tokens, K=k, LOG_K=_log2(k), G=g,
                                LOG_G=_log2(g), IDX_BITS=IDX_BITS, LOWEST=LOWEST, DRAW=draw,
                                MAP=to_target is not None, **launch_options(logits.device))
    return tokens if draw else None


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(logits, k, dim=-1) of logits [R, V] (top_k_fits): values [R, k] in the logits' dtype, largest
    first, and their ids long [R, k]; of equal values the lower index first."""
    rows = logits.shape[0]
    width = max(2, triton.next_power_of_2(k))
    keys, n, g = _lists(logits, width)
    values = torch.empty((rows, k), dtype=logits.dtype, device=logits.device)
    ids = torch.empty((rows, k), dtype=torch.long, device=logits.device)
    _row_top_kernel[(rows,)](keys, n, values, ids, k, K=width, LOG_K=_log2(width), G=g, LOG_G=_log2(g),
                             IDX_BITS=IDX_BITS, LOWEST=LOWEST, **launch_options(logits.device))
    return values, ids


@triton.jit
def _accept_kernel(ids_ptr, k, q_ids_ptr, q_probs_ptr, q_stride, p_ids_ptr, p_probs_ptr, p_stride, noise_ptr,
                   out_ptr, R: tl.constexpr, K: tl.constexpr, W: tl.constexpr):
    r = tl.arange(0, R)
    j = r[None, :]  # the other rows, against r[:, None]
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
    # Row r's weight w_r = exp(S_r - max(S_0 .. S_r)), S the cumulative log(p/q) (sampling.block_weights').
    logs = tl.where(drafting, tl.log(pd / tl.maximum(qd, TINY)), 0.0)
    after = tl.sum(tl.where(j <= r[:, None], logs[None, :], 0.0), 1)  # S_{r+1}
    before = tl.sum(tl.where(j == r[:, None] - 1, after[None, :], 0.0), 1)  # S_r (S_0 = 0)
    weight = tl.exp(before - tl.max(tl.where(j < r[:, None], after[None, :], 0.0), 1))
    # Each draft row's residual mass: max(w p - q, 0) summed over p's candidates, q's row on them.
    mass = tl.zeros((R,), dtype=tl.float32)
    for i in range(0, k):
        mass = tl.where(r == i, _residual_mass(i, weight, r, c, w, q_ids_ptr, q_probs_ptr, q_stride, p_ids_ptr,
                                               p_probs_ptr, p_stride), mass)
    room = mass + (1.0 - weight)  # sampling.block_weights' rounding
    h = tl.where(r < k, tl.where(room > 0, mass / tl.maximum(room, TINY), 1.0), weight)  # h_r; h_k = w_k
    u = tl.load(noise_ptr + r - 1, mask=(r >= 1) & (r <= k), other=1.0)  # u_r: the uniform of draft r
    n = tl.max(tl.where((r >= 1) & (r <= k) & (u < h), r, 0), 0)  # the last row kept (none: 0)
    # At row n: the residual (p's last row when every draft is kept), on p's candidates; drawn by the race.
    p_row_ids = tl.load(p_ids_ptr + n * p_stride + c)
    p_row = tl.load(p_probs_ptr + n * p_stride + c)
    drafted = n + 0 * w < k  # (a vector: the interpreter takes no scalar mask)
    q_row_ids = tl.load(q_ids_ptr + n * q_stride + w, mask=drafted, other=-2)
    q_row = tl.load(q_probs_ptr + n * q_stride + w, mask=drafted, other=0.0)
    w_n = tl.sum(tl.where(r == n, weight, 0.0), 0)
    residual = tl.where(n < k, tl.maximum(w_n * p_row - _on(p_row_ids, q_row_ids, q_row), 0.0), p_row)
    weights = tl.where(tl.sum(residual, 0) > 0, residual, p_row)
    e = tl.load(noise_ptr + R + c)
    best = tl.argmax(weights / -tl.log(tl.maximum(e, U_FLOOR)), 0, tie_break_left=True)
    tl.store(out_ptr, n.to(tl.int64))
    tl.store(out_ptr + 1, tl.sum(tl.where(c == best, p_row_ids, 0), 0).to(tl.int64))
    tl.store(out_ptr + 2 + r, drafts, mask=drafting)


@triton.jit
def _residual_mass(i, weight, r, c, w, q_ids_ptr, q_probs_ptr, q_stride, p_ids_ptr, p_probs_ptr, p_stride):
    """Draft row i's sum of max(w_i p - q, 0) over p's candidates."""
    p_ids = tl.load(p_ids_ptr + i * p_stride + c)
    p = tl.load(p_probs_ptr + i * p_stride + c)
    q_ids = tl.load(q_ids_ptr + i * q_stride + w)
    q = tl.load(q_probs_ptr + i * q_stride + w)
    return tl.sum(tl.maximum(tl.sum(tl.where(r == i, weight, 0.0), 0) * p - _on(p_ids, q_ids, q), 0.0), 0)


@triton.jit
def _on(p_ids, q_ids, q):
    """q's probabilities [W] of ids q_ids at p's ids [K] (0 where q has none)."""
    return tl.sum(tl.where(p_ids[:, None] == q_ids[None, :], q[None, :], 0.0), 1)


def accept(ids: torch.Tensor, q_ids: torch.Tensor, q_probs: torch.Tensor, p_ids: torch.Tensor,
           p_probs: torch.Tensor) -> torch.Tensor:
    """sampling.accept (block verification) as one program: ids [k+1] = [last, drafts...], q rows [>= k, W], p rows
    [k+1, K] -> long [2 + k] = [accepted drafts, the next token, drafts...]."""
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
