"""Skinny bf16 GEMM for batch-size-1 steps: out[M, N] = x[M, K] @ W[N, K]^T with M <= 16.

At M = 1..16 the product is a weight stream: every byte of W is read once, so the
kernel is judged by bandwidth, not FLOPs. Each program owns BLOCK_N output columns
(rows of W) and, with SPLIT_K > 1, one slice of K; partial sums of a split are
added atomically into a float32 buffer. x is padded to 16 rows for tl.dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_options, start as pdl_start


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, out_ptr, M, N, K, K_PER: tl.constexpr, stride_xm, stride_wn, stride_om,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, 16)
    k_start = pid_k * K_PER
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for i in range(0, K_PER // BLOCK_K):
        offs_k = k_start + i * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                    mask=(offs_n[:, None] < N) & kmask[None, :], other=0.0)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & kmask[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if ATOMIC:
        tl.atomic_add(out, acc, mask=mask)
    else:
        # rounded to x's dtype first: a float32 output holds what the bf16 product widened would
        tl.store(out, acc.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty), mask=mask)


def config_for(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K): enough programs to cover every SM several times over."""
    block_n = 32 if n >= 8192 else 16
    programs = triton.cdiv(n, block_n)
    split = 1
    while programs * split < 528 and k // (split * 2) >= 512:  # ~4 waves on 132 SMs
        split *= 2
    return block_n, 256, split


def skinny_linear(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int] | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out_dtype float32: the product rounded to x's dtype and stored widened (logits for sampling) in the
    same kernel, no conversion after it."""
    m, k = x.shape
    n = w.shape[0]
    assert m <= 16 and w.shape[1] == k and x.is_contiguous() and w.is_contiguous()
    block_n, block_k, split = config or config_for(n, k)
    if split > 1:
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    grid = (triton.cdiv(n, block_n), split)
    k_per = triton.cdiv(k, split * block_k) * block_k
    _skinny_kernel[grid](x, w, out, m, n, k, k_per, x.stride(0), w.stride(0), out.stride(0),
                         BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split, ATOMIC=split > 1,
                         **launch_options(x.device))
    if split > 1:
        out = out.to(x.dtype)
        return out if out_dtype in (None, x.dtype) else out.to(out_dtype)
    return out
