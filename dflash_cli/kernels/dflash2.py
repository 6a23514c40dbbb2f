"""DFlash 2's extra work in a draft step as few kernels (models/dflash2.py holds the torch reference of each).

- `dynamic_conv`: the grouped dynamic causal convolution of one block (torch: 2 + 3 * taps kernels per call, four
  calls per layer), with the sublayer's residual add where given. Each program a block of channels for every row.
  `conv_add_rms_norm`: the same convolution of a sublayer's output, its residual add and the next sublayer's
  RMSNorm, one program a row (a sublayer's end and the next one's start: the norm costs no launch of its own).
- `top_k`: the candidate selector's top-K of each row's logits (kernels/sampling.top_k; torch: radix selection).
- `selector_scores`: the candidate selector's scores [k, K, K] from the top-K candidates and their logits, the
  anchor and the rows' projected states (torch: a cat, two gathers, a product, a batched product and an add). One
  program per draft row, its K x K edges one small float32 product (Triton's interpreter has no bf16 tl.dot).
- `selector_walk`: the walk over those scores, one program for the whole block (torch: 2-3 kernels per draft row,
  and a softmax and a draw per row when sampling). Sampled, it draws with the exponential race on noise drawn by
  torch before it (`noise`, Exp(1) [k, K]), so the RNG is the generator the torch path's `race` draws from.

Each rounds where the torch reference rounds (products and sums of the model's dtype rounded to it): bf16 results
are the reference's up to the order of a sum (the selector's edges, the norm's squares) and float32 ones agree to a
few ulps (a product and sum may fuse).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, start as pdl_start
from .sampling import top_k, top_k_fits  # noqa: F401 (the selector's candidates: the sampler's exact top-k)

CONV_CHANNELS = 128  # channels per program of the convolution (Qwen3-4B's drafter: 20 programs)
CONV_MAX_ROWS = 32  # block rows one convolution program holds
# The convolutions compile without FP contraction: LLVM narrows their float32 ops to bf16 ones (exact: each rounds
# once, as torch's), then fuses a tap's product into the next add (fma.rn.bf16), skipping the product's rounding
# (13% of outputs one bf16 ulp off the reference on an H200).
NO_FMA = {"enable_fp_fusion": False}
TINY = tl.constexpr(1.1754943508222875e-38)  # torch.finfo(torch.float32).tiny: race's floor on the noise


@triton.jit
def _convolve_rows(x_ptr, d_ptr, b_ptr, t, c, inside, H, stride_x, stride_dt, stride_dj, GROUP: tl.constexpr,
                   TAPS: tl.constexpr, dt: tl.constexpr):
    """out[t, c] = sum_j (base[j, c] + delta[t, j, c // GROUP]) * x[t - j, c] in float32 for rows t and channels c
    (broadcast against each other; `inside` masks them), summed in the reference's order and rounded to dt where
    it rounds; rows before the block's first are zeros."""
    out = tl.zeros(inside.shape, tl.float32)
    for j in tl.static_range(TAPS):
        xs = tl.load(x_ptr + tl.maximum(t - j, 0) * stride_x + c, mask=inside, other=0.0).to(tl.float32)
        xs = tl.where(t >= j, xs, 0.0)
        w = (tl.load(b_ptr + j * H + c, mask=c < H, other=0.0).to(tl.float32)
             + tl.load(d_ptr + t * stride_dt + j * stride_dj + c // GROUP, mask=inside, other=0.0).to(tl.float32))
        p = (w.to(dt).to(tl.float32) * xs).to(dt).to(tl.float32)
        if j == 0:
            out = p
        else:
            out = (out + p).to(dt).to(tl.float32)
    return out


@triton.jit
def _dynamic_conv_kernel(x_ptr, d_ptr, b_ptr, r_ptr, out_ptr, T, H, stride_x, stride_dt, stride_dj, stride_r,
                         GROUP: tl.constexpr, TAPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                         RESIDUAL: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    t = tl.arange(0, BLOCK_T)[:, None]
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    inside = (t < T) & (c < H)
    dt = out_ptr.dtype.element_ty
    out = _convolve_rows(x_ptr, d_ptr, b_ptr, t, c, inside, H, stride_x, stride_dt, stride_dj, GROUP, TAPS, dt)
    if RESIDUAL:
        out = tl.load(r_ptr + t * stride_r + c, mask=inside, other=0.0).to(tl.float32) + out
    tl.store(out_ptr + t * H + c, out.to(dt), mask=inside)


def conv_fits(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual=None) -> bool:
    """Whether `dynamic_conv` takes these: one dtype, unit-stride channels, at most CONV_MAX_ROWS rows."""
    rows, taps, groups = delta.shape
    return (x.dim() == 2 and x.shape[0] == rows <= CONV_MAX_ROWS and x.shape[1] % groups == 0 and x.stride(1) == 1
            and delta.stride(2) == 1 and base.is_contiguous() and base.shape == (taps, x.shape[1])
            and x.dtype == delta.dtype == base.dtype
            and (residual is None or (residual.shape == x.shape and residual.stride(1) == 1
                                      and residual.dtype == x.dtype)))


def dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual=None) -> torch.Tensor:
    """models/dflash2.convolve in one kernel: x [T, H], delta [T, taps, G] (a view of the projection: any row and
    tap strides), base [taps, H] -> [T, H] (+ residual [T, H] where given)."""
    rows, h = x.shape
    taps, groups = delta.shape[1], delta.shape[2]
    out = torch.empty((rows, h), dtype=x.dtype, device=x.device)
    r = x if residual is None else residual
    _dynamic_conv_kernel[(triton.cdiv(h, CONV_CHANNELS),)](
        x, delta, base, r, out, rows, h, x.stride(0), delta.stride(0), delta.stride(1), r.stride(0),
        GROUP=h // groups, TAPS=taps, BLOCK_T=max(2, triton.next_power_of_2(rows)), BLOCK_C=CONV_CHANNELS,
        RESIDUAL=residual is not None, **NO_FMA, **launch_options(x.device))
    return out


@triton.jit
def _conv_add_rms_norm_kernel(x_ptr, d_ptr, b_ptr, r_ptr, w_ptr, h_out, x_out, H, stride_x, stride_dt, stride_dj,
                              stride_r, eps, GROUP: tl.constexpr, TAPS: tl.constexpr, BLOCK: tl.constexpr,
                              PDL: tl.constexpr):
    pdl_start(PDL)
    t = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    real = c < H
    dt = h_out.dtype.element_ty
    # Row t's convolution over all its channels, then the residual add and the norm
    out = _convolve_rows(x_ptr, d_ptr, b_ptr, t, c, real, H, stride_x, stride_dt, stride_dj, GROUP, TAPS, dt)
    h = (tl.load(r_ptr + t * stride_r + c, mask=real, other=0.0).to(tl.float32) + out).to(dt)
    tl.store(h_out + t * H + c, h, mask=real)
    hf = h.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / H + eps)  # as elementwise's RMSNorm
    norm = tl.load(w_ptr + c, mask=real, other=0.0).to(tl.float32)
    tl.store(x_out + t * H + c, ((hf * r).to(dt).to(tl.float32) * norm).to(dt), mask=real)


def conv_add_rms_norm(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor,
                      weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A sublayer's end and the next one's start in one kernel: h = residual + dynamic_conv(x, delta, base), and
    h's RMSNorm by `weight` -> (h, normed) [T, H]. One program a row, all its channels (conv_fits; weight in x's
    dtype, contiguous)."""
    rows, h = x.shape
    taps, groups = delta.shape[1], delta.shape[2]
    h_out = torch.empty((rows, h), dtype=x.dtype, device=x.device)
    x_out = torch.empty_like(h_out)
    block = triton.next_power_of_2(h)
    _conv_add_rms_norm_kernel[(rows,)](x, delta, base, residual, weight, h_out, x_out, h, x.stride(0),
                                       delta.stride(0), delta.stride(1), residual.stride(0), eps, GROUP=h // groups,
                                       TAPS=taps, BLOCK=block, num_warps=8 if block >= 8192 else 4, **NO_FMA,
                                       **launch_options(x.device))
    return h_out, x_out


@triton.jit
def _selector_scores_kernel(cand_ptr, unary_ptr, anchor_ptr, proj_ptr, a_ptr, b_ptr, out_ptr, K, R, stride_c,
                            stride_u, stride_p, stride_a, stride_b, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                            PDL: tl.constexpr):
    pdl_start(PDL)
    i = tl.program_id(0)
    n = tl.arange(0, BLOCK_K)
    real = n < K
    dt = a_ptr.dtype.element_ty
    # The predecessors: the row before's candidates; row 0's, the anchor (every a alike)
    before = tl.load(cand_ptr + tl.maximum(i - 1, 0) * stride_c + n, mask=real, other=0)
    before = tl.where(i > 0, before, tl.load(anchor_ptr))
    cand = tl.load(cand_ptr + i * stride_c + n, mask=real, other=0)
    edges = tl.zeros((BLOCK_K, BLOCK_K), tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        in_r = r < R
        state = tl.load(proj_ptr + i * stride_p + r, mask=in_r, other=0.0).to(tl.float32)
        pred = tl.load(a_ptr + before[:, None] * stride_a + r[None, :], mask=real[:, None] & in_r[None, :], other=0.0)
        # A[p] * (W h), rounded as the reference's product; then < ., B[c] > summed in float32 (as bmm's
        # accumulator: products of the model's dtype are exact in float32, the sums then agree up to their order)
        context = (pred.to(tl.float32) * state[None, :]).to(dt).to(tl.float32)
        succ = tl.load(b_ptr + cand[None, :] * stride_b + r[:, None], mask=in_r[:, None] & real[None, :], other=0.0)
        edges = tl.dot(context, succ.to(tl.float32), edges, input_precision="ieee")
    unary = tl.load(unary_ptr + i * stride_u + n, mask=real, other=0.0).to(tl.float32)
    scores = unary[None, :] + edges.to(dt).to(tl.float32)
    dst = out_ptr + i * K * K + n[:, None] * K + n[None, :]
    tl.store(dst, scores.to(out_ptr.dtype.element_ty), mask=real[:, None] & real[None, :])


def scores_fit(candidates, unary, projected, predecessor, successor) -> bool:
    """Whether `selector_scores` takes these: unit-stride rows, the codebooks in the projected states' dtype."""
    return (candidates.stride(1) == 1 and unary.stride(1) == 1 and projected.stride(1) == 1
            and predecessor.stride(1) == 1 and successor.stride(1) == 1
            and predecessor.dtype == successor.dtype == projected.dtype)


def selector_scores(candidates: torch.Tensor, unary: torch.Tensor, anchor: torch.Tensor, projected: torch.Tensor,
                    predecessor: torch.Tensor, successor: torch.Tensor) -> torch.Tensor:
    """CandidateSelector.scores' product in one kernel: candidates [k, K] and their logits `unary` [k, K], the
    anchor token [1], the rows' projected states [k, R] and the codebooks [V, R] -> scores [k, K, K]
    (unary[i, b] + < A[before[i, a]] * projected[i], B[candidates[i, b]] >)."""
    k, K = candidates.shape
    R = projected.shape[1]
    out = torch.empty((k, K, K), dtype=torch.promote_types(unary.dtype, projected.dtype), device=unary.device)
    _selector_scores_kernel[(k,)](candidates, unary, anchor, projected, predecessor, successor, out, K, R,
                                  candidates.stride(0), unary.stride(0), projected.stride(0), predecessor.stride(0),
                                  successor.stride(0), BLOCK_K=max(16, triton.next_power_of_2(K)),
                                  BLOCK_R=min(64, max(16, triton.next_power_of_2(R))), **launch_options(unary.device))
    return out


@triton.jit
def _selector_walk_kernel(cand_ptr, scores_ptr, temp_ptr, noise_ptr, tokens_ptr, q_ptr, ROWS, K, stride_c,
                          stride_si, stride_sa, stride_n, stride_q, SAMPLED: tl.constexpr, BLOCK_K: tl.constexpr,
                          PDL: tl.constexpr):
    pdl_start(PDL)
    n = tl.arange(0, BLOCK_K)
    real = n < K
    pick = tl.program_id(0) * 0  # row 0 follows the anchor: scores[0, a] alike for every a
    for i in range(ROWS):
        row = tl.load(scores_ptr + i * stride_si + pick * stride_sa + n, mask=real, other=float("-inf"))
        row = row.to(tl.float32)
        if SAMPLED:
            s = row / tl.load(temp_ptr)
            e = tl.where(real, tl.exp(s - tl.max(s, 0)), 0.0)
            q = e / tl.sum(e, 0)
            tl.store(q_ptr + i * stride_q + n, q, mask=real)
            noise = tl.load(noise_ptr + i * stride_n + n, mask=real, other=1.0)
            race = tl.where(real, q / tl.maximum(noise, TINY), -1.0)  # argmax(q / Exp(1)) draws from q
            pick = tl.argmax(race, 0, tie_break_left=True)
        else:
            row = tl.where(row != row, float("inf"), row)  # torch's argmax takes a NaN
            pick = tl.argmax(row, 0, tie_break_left=True)
        tl.store(tokens_ptr + i, tl.load(cand_ptr + i * stride_c + pick))


def selector_walk(candidates: torch.Tensor, scores: torch.Tensor, temperature=None, noise=None):
    """CandidateSelector.walk in one kernel: candidates [k, K], scores [k, K, K] -> (tokens long [k], q rows
    float32 [k, K] or None). Greedy (temperature None): each row's argmax after the row before's pick. Sampled:
    temperature a device float32 scalar (read in place: one graph serves every temperature), noise Exp(1) [k, K]
    float32; row i draws argmax(q_i / noise[i]), the exponential race of sampling.race."""
    k, K = candidates.shape
    sampled = temperature is not None
    assert not sampled or (noise.shape == (k, K) and noise.dtype == torch.float32 and noise.stride(1) == 1)
    tokens = torch.empty(k, dtype=candidates.dtype, device=candidates.device)
    q = torch.empty((k, K), dtype=torch.float32, device=scores.device) if sampled else None
    _selector_walk_kernel[(1,)](candidates, scores, temperature if sampled else scores, noise if sampled else scores,
                                tokens, q if sampled else tokens, k, K, candidates.stride(0), scores.stride(0),
                                scores.stride(1), noise.stride(0) if sampled else 0, K, SAMPLED=sampled,
                                BLOCK_K=max(16, triton.next_power_of_2(K)), num_warps=1,
                                **launch_options(scores.device))
    return tokens, q


def walk_fits(candidates: torch.Tensor, scores: torch.Tensor, temperature=None) -> bool:
    """Whether `selector_walk` takes these (its noise: contiguous float32 [k, K])."""
    return (candidates.stride(1) == 1 and scores.stride(2) == 1 and candidates.shape[1] <= 1024
            and (temperature is None or temperature.dtype == torch.float32))
