"""Fused Triton kernels for the small per-layer operations of a decode step.

Each replaces a chain of torch kernels (RMSNorm was ~7 launches, RoPE ~7, SiLU-mul 2)
with one, and rounds exactly where the torch reference in layers/ops.py rounds, so
the two agree to the last bf16 bit up to the reciprocal square root's approximation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import block_trace
from .pdl import launch_options, start as pdl_start

# Warps of a q/k norm + RoPE program (one head vector of a row): one warp sums its squares without a block-wide
# reduction, faster than Triton's default 4 in every span (docs/TUNING.md).
ROPE_WARPS = 1


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, B, stride_a, stride_b, D: tl.constexpr, BLOCK: tl.constexpr,
                     eps, PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0)
    a, b = row // B, row % B
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    x = tl.load(x_ptr + a * stride_a + b * stride_b + offs, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    xn = (x * r).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + offs, (xn * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    x3 = x.reshape(-1, 1, d) if x.dim() <= 2 else x.reshape(-1, x.shape[-2], d)
    assert x3.stride(-1) == 1
    a, b = x3.shape[0], x3.shape[1]
    out = torch.empty((a, b, d), dtype=x.dtype, device=x.device)
    _rms_norm_kernel[(a * b,)](x3, weight, out, b, x3.stride(0), x3.stride(1), D=d,
                               BLOCK=triton.next_power_of_2(d), eps=eps, **launch_options(x.device))
    return out.reshape(x.shape)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, stride_t, stride_h, D: tl.constexpr, R: tl.constexpr,
                 PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0)
    t, h = row // H, row % H
    offs = tl.arange(0, D)
    base = x_ptr + t * stride_t + h * stride_h
    dt = out_ptr.dtype.element_ty
    c, s = rope_cos_sin(cos_ptr, sin_ptr, t * R, offs, None, D, R, dt)
    y = rope(tl.load(base + offs).to(tl.float32), tl.load(base + rope_pair(D, R)).to(tl.float32), c, s, D, R, dt)
    tl.store(out_ptr + row * D + offs, y)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated on its first R dims by the rows' cos/sin [T, R] (R <= D); the others pass through."""
    t, h, d = x.shape
    assert x.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    _rope_kernel[(t * h,)](x, cos, sin, out, h, x.stride(0), x.stride(1), D=d, R=cos.shape[-1],
                           **launch_options(x.device))
    return out


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, I, stride_t, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    dt = out_ptr.dtype.element_ty
    g = tl.load(x_ptr + t * stride_t + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + t * stride_t + I + offs, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(out_ptr + t * I + offs, (s * u).to(dt), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    t, two_i = gate_up.shape
    i = two_i // 2
    assert gate_up.stride(-1) == 1
    out = torch.empty((t, i), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(t, triton.cdiv(i, block))](gate_up, out, i, gate_up.stride(0), BLOCK=block,
                                                 **launch_options(gate_up.device))
    return out


@triton.jit
def norm_rope(x, xp, w, wp, c, s, eps, D: tl.constexpr, R: tl.constexpr, dt: tl.constexpr):
    """RMSNorm by w, then RoPE of the first R dims, of head vectors x [..., D] in float32, rounded step by step as
    the torch reference (ops.qk_norm_rope) rounds -> [..., D] in dt. xp, wp: x and w at each dim's rotate_half
    partner (`rope_pair`); c, s: the rows' cos and sin over the D dims (`rope_cos_sin`). The split attention
    kernel's own norm and RoPE of fresh rows use it too, so both paths write the same keys."""
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=-1, keep_dims=True) / D + eps)
    y = ((x * r).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
    yp = ((xp * r).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
    return rope(y, yp, c, s, D, R, dt)


@triton.jit
def rope(y, yp, c, s, D: tl.constexpr, R: tl.constexpr, dt: tl.constexpr):
    """RoPE of the first R dims of head vectors y [..., D] in float32 (yp: y at each dim's rotate_half partner), the
    reference's x * cos + cat(-x2, x1) * sin with each product rounded to dt -> [..., D] in dt. Past R, cos 1 and
    sin 0 (`rope_cos_sin`) leave y as it is: a partial RoPE's unrotated dims (Qwen3.5)."""
    sign = tl.where(tl.arange(0, D) < R // 2, -1.0, 1.0)
    return ((y * c).to(dt).to(tl.float32) + (sign * yp * s).to(dt).to(tl.float32)).to(dt)


@triton.jit
def rope_pair(D: tl.constexpr, R: tl.constexpr):
    """Each of D dims' rotate_half partner: (d + R/2) % R among the first R (rotated) dims; past them, itself."""
    offs = tl.arange(0, D)
    if R == D:
        pair = (offs + D // 2) % D
    else:
        pair = tl.where(offs < R, (offs + R // 2) % R, offs)
    return pair


@triton.jit
def rope_cos_sin(cos_ptr, sin_ptr, at, d, mask, D: tl.constexpr, R: tl.constexpr, dt: tl.constexpr):
    """cos and sin of dims d from tables of R columns, at `at` (row * R, broadcast against d; mask: the rows loaded,
    or None for all), in float32 rounded to dt as the reference rounds them. Dims from R on (a partial RoPE's) get
    cos 1 and sin 0, so `rope` passes them through."""
    if R < D:
        if mask is None:
            rotated = d < R
        else:
            rotated = mask & (d < R)
        c = tl.load(cos_ptr + at + d, mask=rotated, other=1.0).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + at + d, mask=rotated, other=0.0).to(dt).to(tl.float32)
    elif mask is None:
        c = tl.load(cos_ptr + at + d).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + at + d).to(dt).to(tl.float32)
    else:
        c = tl.load(cos_ptr + at + d, mask=mask, other=0.0).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + at + d, mask=mask, other=0.0).to(dt).to(tl.float32)
    return c, s


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, q_out, k_out, v_out, H, KV,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, eps,
                         stride_kl, stride_vl, stride_wl, stride_ol, trace_ptr,
                         D: tl.constexpr, R: tl.constexpr, WRITE: tl.constexpr, PDL: tl.constexpr,
                         TRACE: tl.constexpr):
    t0 = block_trace.now(TRACE)
    pdl_start(PDL)
    t1 = block_trace.now(TRACE)
    # One program per (row, head) over the q heads, then the k heads (RMSNorm then RoPE of the first R dims, rounded
    # as the reference), then with WRITE the v heads. With WRITE, k and v go straight into the cache rows at the
    # rows' positions (k_out/v_out are the layer's cache, stride_ot its row stride): no separate KV copy.
    # Axis 1 is the layer where several layers' keys/values are written at once (the stride_*l; then H = 0).
    pid = tl.program_id(0)
    layer = tl.program_id(1)
    k_ptr += layer * stride_kl
    v_ptr += layer * stride_vl
    kw_ptr += layer * stride_wl
    k_out += layer * stride_ol
    v_out += layer * stride_ol
    per_row = H + KV + KV * WRITE
    t, head = pid // per_row, pid % per_row
    dt = q_out.dtype.element_ty
    offs = tl.arange(0, D)
    pair = rope_pair(D, R)
    if WRITE:
        row_out = tl.load(pos_ptr + t)
    else:
        row_out = t
    if head < H + KV:
        is_q = head < H
        kh = head - H
        src = tl.where(is_q, q_ptr + t * stride_qt + head * stride_qh, k_ptr + t * stride_kt + kh * stride_kh)
        w_ptr = tl.where(is_q, qw_ptr, kw_ptr)
        dst = tl.where(is_q, q_out + (t * H + head) * D, k_out + row_out * stride_ot + kh * D)
        # With WRITE the tables are whole ([max_positions, R]) and read at the row's position: no gather
        # kernel ahead of this one; without, they are the rows' own [T, R].
        x = tl.load(src + offs).to(tl.float32)
        xp = tl.load(src + pair).to(tl.float32)
        c, s = rope_cos_sin(cos_ptr, sin_ptr, row_out * R, offs, None, D, R, dt)
        tl.store(dst + offs, norm_rope(x, xp, tl.load(w_ptr + offs).to(tl.float32),
                                       tl.load(w_ptr + pair).to(tl.float32), c, s, eps, D, R, dt))
    else:
        vh = head - H - KV
        src = v_ptr + t * stride_vt + vh * stride_vh
        dst = v_out + row_out * stride_ot + vh * D
        tl.store(dst + offs, tl.load(src + offs))
    block_trace.record(trace_ptr, t0, t1, TRACE)


def qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin):
    """Per-head RMSNorm of q [T, H, D] and k [T, KV, D], then RoPE of their first R dims by the rows' cos/sin
    [T, R] (R <= D: the rest pass through)."""
    t, h, d = q.shape
    kv = k.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    q_out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, kv, d), dtype=k.dtype, device=k.device)
    grid = (t * (h + kv),)
    _qk_norm_rope_kernel[grid](q, k, k, q_weight, k_weight, cos, sin, cos, q_out, k_out, k_out, h, kv,
                               q.stride(0), q.stride(1), k.stride(0), k.stride(1), 0, 0, kv * d, eps,
                               0, 0, 0, 0, D=d, R=cos.shape[-1], WRITE=False, **block_trace.args("rope", grid, q),
                               **launch_options(q.device), num_warps=ROPE_WARPS)
    return q_out, k_out


def qk_norm_rope_write(q, k, v, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, positions):
    """As qk_norm_rope, with k and v stored into the cache rows [max_len, KV, D] at `positions`; returns q.
    cos/sin are the whole tables [max_positions, R], read at `positions`."""
    t, h, d = q.shape
    kv = k.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and cos.is_contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and sin.is_contiguous()
    q_out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    grid = (t * (h + 2 * kv),)
    _qk_norm_rope_kernel[grid](q, k, v, q_weight, k_weight, cos, sin, positions, q_out, k_cache,
                               v_cache, h, kv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                               v.stride(0), v.stride(1), k_cache.stride(0), eps, 0, 0, 0, 0,
                               D=d, R=cos.shape[-1], WRITE=True, **block_trace.args("rope", grid, q),
                               **launch_options(q.device), num_warps=ROPE_WARPS)
    return q_out


def k_norm_rope_write_layers(k, v, k_weights, eps, cos, sin, k_cache, v_cache, positions):
    """Every layer's keys (RMSNorm, RoPE) and values into the cache at `positions`: k, v [T, L, KV, D],
    k_weights [L, D], caches [L, max_len, KV, D], cos/sin whole tables. One launch for all layers."""
    t, n_layers, kv, d = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_weights.is_contiguous()
    assert cos.is_contiguous() and sin.is_contiguous()
    grid = (t * 2 * kv, n_layers)
    _qk_norm_rope_kernel[grid](
        k, k, v, k_weights, k_weights, cos, sin, positions, k, k_cache, v_cache, 0, kv, 0, 0, k.stride(0),
        k.stride(2), v.stride(0), v.stride(2), k_cache.stride(1), eps, k.stride(1), v.stride(1), k_weights.stride(0),
        k_cache.stride(0), D=d, R=cos.shape[-1], WRITE=True, **block_trace.args("rope", grid, k),
        **launch_options(k.device), num_warps=ROPE_WARPS)


@triton.jit
def _add_rms_norm_kernel(h_ptr, d_ptr, w_ptr, h_out, x_out, stride_h, stride_d, eps, trace_ptr, D: tl.constexpr,
                         BLOCK: tl.constexpr, PDL: tl.constexpr, TRACE: tl.constexpr):
    t0 = block_trace.now(TRACE)
    pdl_start(PDL)
    t1 = block_trace.now(TRACE)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    dt = h_out.dtype.element_ty
    s = (tl.load(h_ptr + row * stride_h + offs, mask=mask, other=0.0).to(tl.float32)
         + tl.load(d_ptr + row * stride_d + offs, mask=mask, other=0.0).to(tl.float32)).to(dt)
    tl.store(h_out + row * D + offs, s, mask=mask)
    x = s.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_out + row * D + offs, ((x * r).to(dt).to(tl.float32) * w).to(dt), mask=mask)
    block_trace.record(trace_ptr, t0, t1, TRACE)


def add_rms_norm(h, delta, weight, eps):
    t, d = h.shape
    assert h.stride(-1) == 1 and delta.stride(-1) == 1
    h_out = torch.empty_like(h, memory_format=torch.contiguous_format)
    x_out = torch.empty_like(h_out)
    _add_rms_norm_kernel[(t,)](h, delta, weight, h_out, x_out, h.stride(0), delta.stride(0), eps, D=d,
                               BLOCK=triton.next_power_of_2(d), **block_trace.args("norm", (t,), h),
                               **launch_options(h.device))
    return h_out, x_out


@triton.jit
def _stage_step_kernel(ids_ptr, src_ptr, pos_ptr, off_ptr, stride_src, start, N, S, fill, OFFSET: tl.constexpr,
                       BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    m = r < N
    ids = tl.load(src_ptr + r * stride_src, mask=r < S, other=fill)
    pos = start + r.to(tl.int64)
    if OFFSET:
        pos += tl.load(off_ptr)
    tl.store(ids_ptr + r, ids, mask=m)
    tl.store(pos_ptr + r, pos, mask=m)


def stage_step(ids: torch.Tensor, src: torch.Tensor, positions: torch.Tensor, start: int, offset=None,
               fill: int = 0) -> None:
    """ids[:S] = src (S = its length), ids[S:] = fill, and positions[:] = start (+ offset[0], a device scalar, where
    given), start + 1, ... (int64 [N], ids and positions contiguous): a graph's device-side inputs in one launch
    (runtime/graphs.stage_step)."""
    n = ids.shape[0]
    _stage_step_kernel[(1,)](ids, src, positions, positions if offset is None else offset, src.stride(0), start, n,
                             src.shape[0], fill, OFFSET=offset is not None, BLOCK=max(16, triton.next_power_of_2(n)),
                             num_warps=1)
