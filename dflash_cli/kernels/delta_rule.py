"""A Gated DeltaNet layer's decode / verify rows and the rewind's fold as Triton kernels, for the CUDA graphs of a
hybrid target's steps. layers/delta_rule.py holds the torch reference of each (and picks these on CUDA);
layers/recurrent_state.py says what a forward keeps and why the fold is exact.

* `short_conv`: the causal depthwise conv + SiLU of a forward's rows over [the previous K-1 inputs ; the rows], one
  program per (block of channels, row); it also keeps the rows' pre-conv inputs for a rewind and writes the window
  the next forward starts from.
* `recurrent`: T rows (1..32) of the delta rule. One program per (block of BV value columns, value head) loads its
  [d_k, BV] tile of the state once, runs every row in registers (the l2 norms, q's scale, β and the decay computed
  inside from the conv output and the projection's b and a rows), writes o and, per row, what the fold needs
  (k_t, δ_t, g_t), and stores its tile of the state after the last row unless held (a verify).
* `gated_rms_norm`: the layer's output norm w * rms_norm(o) * silu(z) in one launch.
* `fold`: every layer's state after row n of the last forward (n read from device memory: no host sync), from the
  state it started from and the rows kept: S = S0, then S = e^{g_t} S + k_t δ_tᵀ for t = 0..n (the recurrence's
  own update with its stored corrections, so rows after n cost nothing). One program per (value block, value head,
  layer); the conv windows in a second launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, start as pdl_start

# Value columns and warps of a recurrent / fold program: a [128, 8] float32 tile in one warp is the FLA / vLLM
# design; the H100 micro-benchmark (docs: shared research, qwen35-hybrid §2.6) measured it the fastest of 8 and 16.
RECURRENT_BV, RECURRENT_WARPS = 8, 1
# The fold streams its tiles once (read S0, write S): wider tiles, more warps per program.
FOLD_BV, FOLD_WARPS = 32, 4
CONV_BLOCK = 256  # channels of a conv program


@triton.jit
def _softplus(x):
    """torch's F.softplus (threshold 20): log1p(e^x), with log1p accurate for small arguments (Goldberg's
    log(u) * y / (u - 1), u = 1 + y)."""
    y = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + y
    log1p = tl.where(u == 1.0, y, tl.log(u) * (y / (u - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _recurrent_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, neg_a_ptr, bias_ptr, s0_ptr, s_ptr, o_ptr,
                      keep_k_ptr, keep_d_ptr, keep_g_ptr, T, HV, HK,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_bt, scale,
                      GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      WRITE: tl.constexpr, KEEP: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    vb, h = tl.program_id(0), tl.program_id(1)
    hk = h // GROUP
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    tile = h * DK * DV + rk[:, None] * DV + rv[None, :]
    mask = mk[:, None] & mv[None, :]
    S = tl.load(s0_ptr + tile, mask=mask, other=0.0)
    neg_a, bias = tl.load(neg_a_ptr + h), tl.load(bias_ptr + h)
    # Each row's inputs are loaded one row ahead (the first before the loop), so their latency overlaps the
    # previous row's arithmetic instead of stalling every row.
    nq = tl.load(q_ptr + hk * stride_qh + rk, mask=mk, other=0.0)
    nk = tl.load(k_ptr + hk * stride_kh + rk, mask=mk, other=0.0)
    nv = tl.load(v_ptr + h * stride_vh + rv, mask=mv, other=0.0)
    na, nb = tl.load(a_ptr + h), tl.load(b_ptr + h)
    for t in range(T):
        q, k, v, a, b = nq.to(tl.float32), nk.to(tl.float32), nv.to(tl.float32), na.to(tl.float32), nb
        nt = tl.minimum(t + 1, T - 1)  # (the last row loads itself again: no mask needed)
        nq = tl.load(q_ptr + nt * stride_qt + hk * stride_qh + rk, mask=mk, other=0.0)
        nk = tl.load(k_ptr + nt * stride_kt + hk * stride_kh + rk, mask=mk, other=0.0)
        nv = tl.load(v_ptr + nt * stride_vt + h * stride_vh + rv, mask=mv, other=0.0)
        na, nb = tl.load(a_ptr + nt * stride_at + h), tl.load(b_ptr + nt * stride_bt + h)
        q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        beta = tl.sigmoid(b.to(tl.float32)).to(b.dtype).to(tl.float32)  # rounded in b's dtype, as torch's
        g = neg_a * _softplus(a + bias)
        S = S * tl.exp(g)
        delta = (v - tl.sum(S * k[:, None], axis=0)) * beta
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * q[:, None], axis=0)
        tl.store(o_ptr + (t * HV + h) * DV + rv, o.to(o_ptr.dtype.element_ty), mask=mv)
        if KEEP:  # the decays by each head's first value block, a key head's rows by its first value head's
            tl.store(keep_d_ptr + (t * HV + h) * DV + rv, delta, mask=mv)
            if vb == 0:
                tl.store(keep_g_ptr + t * HV + h, g)
                if h % GROUP == 0:
                    tl.store(keep_k_ptr + (t * HK + hk) * DK + rk, k, mask=mk)
    if WRITE:
        tl.store(s_ptr + tile, S, mask=mask)


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
              neg_a: torch.Tensor, dt_bias: torch.Tensor, S0: torch.Tensor, S: torch.Tensor | None = None,
              keep=None, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """layers/delta_rule.rows on the GPU (same arguments): q, k [T, H_k, d_k] and v [T, H_v, d_v] (the conv's
    output, any float dtype, unit stride in the last dim), a, b [T, H_v] (unit stride), neg_a, dt_bias float32 [H_v],
    S0 float32 [H_v, d_k, d_v] -> o [T, H_v, d_v] in out_dtype. S: where the state after the last row goes (may be
    S0 itself: each program reads its tile before writing it), None (held). keep: (k [R, H_k, d_k], δ [R, H_v, d_v],
    g [R, H_v]) float32 buffers, R >= T, for the fold."""
    t, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and a.stride(-1) == b.stride(-1) == 1
    assert S0.is_contiguous() and S0.dtype == torch.float32 and (S is None or S.is_contiguous())
    o = torch.empty((t, hv, dv), dtype=out_dtype, device=q.device)
    keep_k, keep_d, keep_g = keep if keep is not None else (S0, S0, S0)
    assert keep is None or all(x.is_contiguous() and x.dtype == torch.float32 for x in keep)
    bv = min(RECURRENT_BV, triton.next_power_of_2(dv))
    grid = (triton.cdiv(dv, bv), hv)
    _recurrent_kernel[grid](q, k, v, a, b, neg_a, dt_bias, S0, S if S is not None else S0, o, keep_k, keep_d, keep_g,
                            t, hv, hk, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                            a.stride(0), b.stride(0), dk**-0.5, GROUP=hv // hk, DK=dk, DV=dv,
                            BK=triton.next_power_of_2(dk), BV=bv, WRITE=S is not None, KEEP=keep is not None,
                            num_warps=RECURRENT_WARPS, **launch_options(q.device))
    return o


@triton.jit
def _conv_kernel(x_ptr, c0_ptr, w_ptr, y_ptr, win_ptr, keep_ptr, T, C, stride_xt,
                 K: tl.constexpr, BC: tl.constexpr, WINDOW: tl.constexpr, KEEP: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    cb, t = tl.program_id(0), tl.program_id(1)
    rc = cb * BC + tl.arange(0, BC)
    mc = rc < C
    acc = tl.zeros([BC], dtype=tl.float32)
    # Row r of [conv0 (K-1 rows) ; x (T rows)]: output row t reads rows t .. t+K-1. (Row numbers as vectors: the
    # interpreter rejects a mask of a vector & a scalar.)
    zero = tl.zeros([BC], dtype=tl.int32)
    for j in tl.static_range(K):
        r = zero + t + j
        old = tl.load(c0_ptr + tl.minimum(r, K - 2) * C + rc, mask=mc & (r < K - 1), other=0.0)
        new = tl.load(x_ptr + tl.maximum(r - (K - 1), 0) * stride_xt + rc, mask=mc & (r >= K - 1), other=0.0)
        w = tl.load(w_ptr + rc * K + j, mask=mc, other=0.0).to(tl.float32)
        acc += tl.where(r < K - 1, old, new).to(tl.float32) * w
    dt = y_ptr.dtype.element_ty
    y = acc.to(dt).to(tl.float32)  # the conv's output rounded, then SiLU, as torch's two kernels
    tl.store(y_ptr + t * C + rc, (y * tl.sigmoid(y)).to(dt), mask=mc)
    if KEEP:
        tl.store(keep_ptr + t * C + rc, tl.load(x_ptr + t * stride_xt + rc, mask=mc), mask=mc)
    if WINDOW:
        if t == T - 1:  # the last row's program: the next window, rows T .. T+K-2
            for i in tl.static_range(K - 1):
                r = zero + T + i
                old = tl.load(c0_ptr + tl.minimum(r, K - 2) * C + rc, mask=mc & (r < K - 1), other=0.0)
                new = tl.load(x_ptr + tl.maximum(r - (K - 1), 0) * stride_xt + rc, mask=mc & (r >= K - 1), other=0.0)
                tl.store(win_ptr + i * C + rc, tl.where(r < K - 1, old, new), mask=mc)


def short_conv(x: torch.Tensor, conv0: torch.Tensor, weight: torch.Tensor, window: torch.Tensor | None = None,
               keep: torch.Tensor | None = None) -> torch.Tensor:
    """layers/delta_rule.short_conv on the GPU (same arguments): x [T, C] (unit channel stride), conv0 [K-1, C],
    weight [C, K] -> silu(conv) [T, C] in x's dtype; window [K-1, C] gets the last K-1 rows of [conv0 ; x],
    keep [R >= T, C] the rows x."""
    t, c = x.shape
    kernel = weight.shape[1]
    assert x.stride(-1) == 1 and conv0.is_contiguous() and weight.is_contiguous() and kernel >= 2
    assert window is None or window.is_contiguous()
    assert keep is None or keep.is_contiguous()
    y = torch.empty((t, c), dtype=x.dtype, device=x.device)
    block = min(CONV_BLOCK, triton.next_power_of_2(c))
    _conv_kernel[(triton.cdiv(c, block), t)](x, conv0, weight, y, window if window is not None else conv0,
                                             keep if keep is not None else conv0, t, c, x.stride(0), K=kernel,
                                             BC=block, WINDOW=window is not None, KEEP=keep is not None,
                                             **launch_options(x.device))
    return y


@triton.jit
def _gated_norm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, H, stride_xt, stride_xh, stride_zt, stride_zh, eps,
                       D: tl.constexpr, BD: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0)
    t, h = row // H, row % H
    rd = tl.arange(0, BD)
    m = rd < D
    dt = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + rd, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + rd, mask=m, other=0.0).to(tl.float32)
    y = ((x * r).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)  # w * unit_rms_norm(x), each rounded to dt
    z = tl.load(z_ptr + t * stride_zt + h * stride_zh + rd, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * D + rd, (y * (z * tl.sigmoid(z))).to(dt), mask=m)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """layers/delta_rule.gated_rms_norm on the GPU: x, z [T, H, D] (unit stride in D), weight [D] in x's dtype
    -> [T, H, D] contiguous, one program per head vector (the torch form is ~10 launches)."""
    t, h, d = x.shape
    assert x.stride(-1) == z.stride(-1) == 1 and weight.dtype == x.dtype and weight.is_contiguous()
    y = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    _gated_norm_kernel[(t * h,)](x, z, weight, y, h, x.stride(0), x.stride(1), z.stride(0), z.stride(1), eps, D=d,
                                 BD=triton.next_power_of_2(d), num_warps=1, **launch_options(x.device))
    return y


@triton.jit
def _fold_kernel(s0_ptr, s_ptr, k_ptr, d_ptr, g_ptr, n_ptr, ROWS, R, HV, HK,
                 GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 PDL: tl.constexpr):
    pdl_start(PDL)
    vb, h, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = h // GROUP
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    tile = (layer * HV + h) * DK * DV + rk[:, None] * DV + rv[None, :]
    mask = mk[:, None] & mv[None, :]
    S = tl.load(s0_ptr + tile, mask=mask, other=0.0)
    n = tl.minimum(tl.load(n_ptr).to(tl.int32), ROWS - 1)
    # Rows after n are not read (the grid stays static, the loop's length is read); each row's k, δ, g load one row
    # ahead, as in the recurrent kernel.
    ng = tl.load(g_ptr + layer * R * HV + h)
    nk = tl.load(k_ptr + (layer * R * HK + hk) * DK + rk, mask=mk, other=0.0)
    nd = tl.load(d_ptr + (layer * R * HV + h) * DV + rv, mask=mv, other=0.0)
    for t in range(n + 1):
        g, k, d = ng, nk, nd
        row = layer * R + tl.minimum(t + 1, n)
        ng = tl.load(g_ptr + row * HV + h)
        nk = tl.load(k_ptr + (row * HK + hk) * DK + rk, mask=mk, other=0.0)
        nd = tl.load(d_ptr + (row * HV + h) * DV + rv, mask=mv, other=0.0)
        S = S * tl.exp(g) + k[:, None] * d[None, :]
    tl.store(s_ptr + tile, S, mask=mask)


@triton.jit
def _fold_conv_kernel(c0_ptr, x_ptr, c_ptr, n_ptr, ROWS, R, C, K: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    cb, layer = tl.program_id(0), tl.program_id(1)
    rc = cb * BC + tl.arange(0, BC)
    mc = rc < C
    n = tl.minimum(tl.load(n_ptr).to(tl.int32), ROWS - 1)
    zero = tl.zeros([BC], dtype=tl.int32)  # row numbers as vectors (see _conv_kernel)
    for i in tl.static_range(K - 1):
        r = zero + n + 1 + i  # row of [conv0 (K-1 rows) ; the forward's inputs]
        old = tl.load(c0_ptr + (layer * (K - 1) + tl.minimum(r, K - 2)) * C + rc, mask=mc & (r < K - 1), other=0.0)
        new = tl.load(x_ptr + (layer * R + tl.maximum(r - (K - 1), 0)) * C + rc, mask=mc & (r >= K - 1), other=0.0)
        tl.store(c_ptr + (layer * (K - 1) + i) * C + rc, tl.where(r < K - 1, old, new), mask=mc)


def fold(S0: torch.Tensor, S: torch.Tensor, k: torch.Tensor, delta: torch.Tensor, g: torch.Tensor,
         conv0: torch.Tensor, conv: torch.Tensor, x: torch.Tensor, n: torch.Tensor, rows: int) -> None:
    """RecurrentState.fold on the GPU, over its stacked buffers: S0, S [L, H_v, d_k, d_v]; k [L, R, H_k, d_k],
    delta [L, R, H_v, d_v], g [L, R, H_v] (float32); conv0, conv [L, K-1, C]; x [L, R, C]; n long [1] on the
    device (clamped to rows - 1). S and conv get the state after row n of the last forward of `rows` rows."""
    layers, hv, dk, dv = S0.shape
    hk, kept = k.shape[2], k.shape[1]
    assert all(t.is_contiguous() for t in (S0, S, k, delta, g, conv0, conv, x)) and 1 <= rows <= kept
    opts = launch_options(S.device)
    bv = min(FOLD_BV, triton.next_power_of_2(dv))
    _fold_kernel[(triton.cdiv(dv, bv), hv, layers)](S0, S, k, delta, g, n, rows, kept, hv, hk, GROUP=hv // hk, DK=dk,
                                                     DV=dv, BK=triton.next_power_of_2(dk), BV=bv,
                                                     num_warps=FOLD_WARPS, **opts)
    c = conv.shape[2]
    block = min(CONV_BLOCK, triton.next_power_of_2(c))
    _fold_conv_kernel[(triton.cdiv(c, block), layers)](conv0, x, conv, n, rows, kept, c, K=conv.shape[1] + 1,
                                                        BC=block, **opts)
