"""Attention of many query rows (a prefill inside a CUDA graph) over a fixed window of the static KV cache.

The split kernel (attention.py) holds all of a KV group's rows in one tile, which suits a few rows; a prefill's
hundreds of rows need the flash form instead: one program per (block of query rows, query head) walks the keys
once with an online softmax. Which keys a row sees comes from `limit` in device memory (its last visible key
index), so one compiled launch serves every start position and the graph never freezes a length. The rows'
order is free (the padded prefill puts its padding rows first); keys below every row's limit are read without a
mask, only the blocks up to the block's largest limit are read at all. A sliding-window layer (a DFlash drafter's)
also passes `low`, the first key each row sees: a specialisation of its own (WINDOWED) that reads, all masked, the
blocks from the smallest low on; full-attention layers compile the kernel they did.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _block(acc, l_i, m_i, q, k_ptr, v_ptr, start, lim, S, stride_ks, stride_vs, offs_d, scale_log2,
           BLOCK_N: tl.constexpr, MASKED: tl.constexpr, low, WINDOWED: tl.constexpr):
    """One block of keys at `start` into the running softmax state (acc, l_i, m_i) of the rows; WINDOWED: keys below
    the rows' low are masked too."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        inside = offs_n < S
        kt = tl.load(k_ptr + offs_n[None, :] * stride_ks + offs_d[:, None], mask=inside[None, :], other=0.0)
        v = tl.load(v_ptr + offs_n[:, None] * stride_vs + offs_d[None, :], mask=inside[:, None], other=0.0)
    else:
        kt = tl.load(k_ptr + offs_n[None, :] * stride_ks + offs_d[:, None])
        v = tl.load(v_ptr + offs_n[:, None] * stride_vs + offs_d[None, :])
    s = tl.dot(q, kt) * scale_log2
    if MASKED:
        s = tl.where(offs_n[None, :] <= lim[:, None], s, float("-inf"))
    if WINDOWED:
        s = tl.where(offs_n[None, :] >= low[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, limit_ptr, out_ptr, T, S, stride_lt, stride_qt, stride_qh, stride_ks,
                    stride_kh, stride_vs, stride_vh, stride_ot, scale_log2,
                    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    low_ptr=None, WINDOWED: tl.constexpr = False):
    head = tl.program_id(1)
    kvh = head // G
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < T
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=live[:, None],
                other=0.0)
    lim = tl.load(limit_ptr + rows * stride_lt, mask=live, other=-1)
    # Keys below `common` are visible to every live row (no mask); the rest up to the largest limit are masked.
    common = (tl.min(tl.where(live, lim, S), axis=0) + 1) // BLOCK_N * BLOCK_N
    end = tl.max(lim, axis=0) + 1
    k_ptr += kvh * stride_kh
    v_ptr += kvh * stride_vh
    # A finite start: a row past T (limit -1) sees nothing and must not make exp2(-inf - -inf).
    m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    if WINDOWED:  # a sliding layer: every block from the smallest low on, masked both ways
        low = tl.load(low_ptr + rows, mask=live, other=0)
        first = tl.min(tl.where(live, low, end), axis=0) // BLOCK_N * BLOCK_N
        for start in range(first, end, BLOCK_N):
            acc, l_i, m_i = _block(acc, l_i, m_i, q, k_ptr, v_ptr, start, lim, S, stride_ks, stride_vs, offs_d,
                                   scale_log2, BLOCK_N, True, low, True)
    else:
        for start in range(0, common, BLOCK_N):
            acc, l_i, m_i = _block(acc, l_i, m_i, q, k_ptr, v_ptr, start, lim, S, stride_ks, stride_vs, offs_d,
                                   scale_log2, BLOCK_N, False, lim, False)
        for start in range(common, end, BLOCK_N):
            acc, l_i, m_i = _block(acc, l_i, m_i, q, k_ptr, v_ptr, start, lim, S, stride_ks, stride_vs, offs_d,
                                   scale_log2, BLOCK_N, True, lim, False)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + head * D + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=live[:, None])


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    d = q.shape[-1]
    return (d in (64, 128) and v.shape[-1] == d and q.shape[1] % k.shape[1] == 0
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1)


def attention_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, limit: torch.Tensor,
                     scale: float, low: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, D]; k, v [S, KV, D] (the window); limit [T] int64, the last key index each row sees (-1: none,
    its output is zero); low [T] int64 or None: a sliding layer's first key a row sees -> [T, H*D]."""
    t, h, d = q.shape
    s, kv, _ = k.shape
    out = torch.empty((t, h * d), dtype=q.dtype, device=q.device)
    # H100: 128-row blocks, 8 warps, 3 stages (~130 KB of shared memory). Where less is available, 2 stages, and
    # 64-row blocks below 128 KB (two stages of 128 rows need ~96 KB plus scratch: more than sm86/sm89 have).
    smem = _shared_memory(q.device)
    block_m = 128 if t > 64 and smem >= 128 * 1024 else 64
    stages = 3 if smem >= 160 * 1024 else 2
    windowed = {} if low is None else dict(low_ptr=low.contiguous(), WINDOWED=True)  # full layers: as before
    _prefill_kernel[(triton.cdiv(t, block_m), h)](
        q, k, v, limit, out, t, s, limit.stride(0), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), out.stride(0), scale * LOG2E, G=h // kv, D=d, BLOCK_M=block_m, BLOCK_N=64,
        num_warps=8 if block_m == 128 else 4, num_stages=stages, **windowed)
    return out


_smem: dict = {}


def _shared_memory(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _smem:
        props = triton.runtime.driver.active.utils.get_device_properties(index)
        _smem[index] = props["max_shared_mem"]
    return _smem[index]
