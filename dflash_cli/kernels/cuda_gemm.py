"""The hand-written skinny GEMM of csrc/skinny_gemm.cu, built and launched through `cubin`.

Where nvcc or a Hopper/Ampere GPU is missing, `available()` is False and callers keep cuBLAS.
"""

from __future__ import annotations

import torch

from . import block_trace, cubin, pdl
from .cubin import Ptr

WS_FLOATS = 1 << 22  # split-K partial tiles: splits * 32 * N floats must fit (at most 32 per 8 rows of W)
MAX_TILES = 1 << 15  # split-K arrival counters: one per 8-row tile
MAX_M = 16


class _Module(cubin.Module):
    """The GEMM's cubin with its split-K workspace; launches use programmatic dependent launch where enabled."""

    def __init__(self, device: torch.device, image: bytes):
        super().__init__(device, image)
        self.attrs = (cubin.attribute(cubin.PROGRAMMATIC_STREAM_SERIALIZATION),) if pdl.enabled(device) else ()
        self.ws = torch.empty(WS_FLOATS, dtype=torch.float32, device=device)
        self.counters = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)

    def launch(self, name: str, grid: tuple[int, int], block: int, smem: int, args: list) -> None:
        super().launch(name, grid, block, smem, args, self.attrs)


def _arch(major: int, minor: int) -> str:
    if major < 8:
        raise RuntimeError("needs compute capability 8.0 or newer (bf16 mma)")
    return f"sm_{major}{minor}"


def _module(device: torch.device) -> _Module | None:
    state = cubin.load("skinny_gemm.cu", device, _arch, "skinny GEMM", _Module,
                       flags=("-DTRACE=1",) if block_trace.ON else ())
    return state if isinstance(state, _Module) else None


def available(device: torch.device) -> bool:
    return device.type == "cuda" and _module(device) is not None


def supports(x: torch.Tensor, w: torch.Tensor) -> bool:
    m, k = x.shape if x.dim() == 2 else (0, 0)
    return (x.dim() == 2 and 1 <= m <= MAX_M and x.dtype == w.dtype == torch.bfloat16 and w.dim() == 2
            and w.shape[1] == k and k % 32 == 0 and w.shape[0] % 8 == 0 and x.is_contiguous() and w.is_contiguous()
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0 and w.shape[0] // 8 <= MAX_TILES)


def plan(m: int, n: int, k: int) -> tuple:
    """(warps per block, K splits over blocks, unroll[, kind]): enough warps in flight to cover every SM."""
    tiles, chunks = n // 8, k // 32
    if m > 8 and n % 16 == 0:
        # 9..16 rows: 16-row tiles (an x fragment serves 16 rows of W), no K split. H100 (gemm_bench.py --tune,
        # 2026-11-23-h100/session3/tile16/): qkv 13.7 us with (4, 1, 4) vs 14.2 for the best 8-row tile plan, gate_up
        # 39.6 (4, 1, 2) vs 40.9, down 22.1 (8, 1, 4); verify-16 replay 3.94 -> 3.81 ms, DFlash draft 0.796 -> 0.773.
        tiles16 = n // 16
        return (8 if k >= 4096 else 4), 1, (4 if k >= 4096 or tiles16 < 512 else 2), "tile16"
    warps, splits = 4, 1
    # Up to 8 rows, more warps on a tile before K splits over blocks: the warps add up in shared memory, the
    # splits through a workspace. H100 (benchmarks/gemm_bench.py --tune, 2026-11-23-h100/tiles/): o_proj 9.0 us
    # with 8 warps and no split vs 10.5 with 4 warps and 2 splits; down 20.6 vs 22.6; decode replay 3.63 ->
    # 3.44 ms. At 16 rows (x loads doubled) 8 warps lose: o 14.6 vs 12.1 us.
    if m <= 8 and tiles * warps < 132 * 16 and chunks // (2 * warps) >= 8:
        warps = 8
    while tiles * splits * warps < 132 * 16 and chunks // (splits * 2 * warps) >= 8 \
            and splits * 2 * 32 * n <= WS_FLOATS:
        splits *= 2
    return warps, splits, 4


def _unpack(config: tuple) -> tuple[int, int, int, str]:
    """(warps, splits, unroll, kind) of a plan; a plan without a kind is an 8-row tile one."""
    return (*config, "tile8")[:4]


def fits(n: int, config: tuple) -> bool:
    """Whether a (warps, splits, unroll[, kind]) plan can run a weight of N rows (tiles, workspace, unroll)."""
    warps, splits, unroll, kind = _unpack(config)
    rows = 16 if kind == "tile16" else 8
    return (unroll in (2, 4, 8) and n % rows == 0 and n // rows <= MAX_TILES
            and (splits == 1 or splits * 32 * n <= WS_FLOATS))


def skinny_linear(x: torch.Tensor, w: torch.Tensor, config: tuple | None = None, swiglu: bool = False,
                  warm: tuple = (), norm: float | None = None, residual: torch.Tensor | None = None,
                  squares: torch.Tensor | None = None, squares_out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T in bf16 with M <= 16 (check `supports` first). With `swiglu`, w is [gate; up] and
    the result silu(x @ gate^T) * (x @ up^T) [M, N/2], the activation applied in the kernel's epilogue.
    norm (eps): x is a residual stream h and the product is rms_norm(h, eps) @ w^T, an RMSNorm without weight
    (the caller folds one into w's columns) inside the kernel. residual [M, N]: the result is residual + x @ w^T
    (not with swiglu).
    squares (one row, with norm): the [1, T] float32 partial sums of squares of x that the product which wrote x
    left (`squares_out`); the norm's scale comes from them (T % 4 == 0), not from x. squares_out (with residual, up
    to 8 rows): a float32 [M, N / 8] tensor the kernel fills with each 8-column tile's sum of the squares of each
    row's results, as rounded. Both run on 8-row tiles only (`takes_squares`).
    warm: up to two (address, bytes) ranges, 16-byte aligned, that the blocks fetch into L2 after their loads."""
    mod = _module(x.device)
    m, k = x.shape
    n = w.shape[0]
    config = config or plan(m, n, k)
    if not fits(n, config):
        raise ValueError(f"plan {config} does not fit a [{n}, {k}] weight")
    warps, splits, unroll, kind = _unpack(config)
    out = torch.empty((m, n // 2 if swiglu else n), dtype=x.dtype, device=x.device)
    aux, eps, mode, sq, sq_tiles = 0, 0.0, "", 0, 0
    if norm is not None:
        eps, mode = float(norm), "_norm"
        if squares is not None:
            _check_squares(squares, (1, k // 8), m == 1 and kind == "tile8" and (k // 8) % 4 == 0)
            mode, sq, sq_tiles = "_scale", squares.data_ptr(), squares.shape[1]
    if residual is not None:
        assert norm is None and not swiglu and residual.shape == out.shape and residual.dtype == x.dtype
        assert residual.is_contiguous()
        aux, mode = residual.data_ptr(), "_resid"
        if squares_out is not None:
            _check_squares(squares_out, (m, n // 8), m <= 8 and kind == "tile8")
            mode, sq = "_resid_sq", squares_out.data_ptr()
    suffix = mode + ("_swiglu" if swiglu else "")
    floats = 4 * ((2 if kind == "tile16" and m > 8 else 1) + (mode == "_norm"))  # per lane: sums, squares
    if kind == "tile16":
        name, grid = f"tile16_t{8 if m <= 8 else 16}_u{unroll}{suffix}", (n // 16, splits)
    else:
        name, grid = f"skinny_m{8 if m <= 8 else 16}_u{unroll}{suffix}", (n // 8, splits)
    if len(warm) > 2:
        raise ValueError(f"the kernel warms at most two ranges, got {len(warm)}")
    (a, a_bytes), (b, b_bytes) = (tuple(warm) + ((0, 0), (0, 0)))[:2]
    trace = block_trace.buffer(f"gemm:{w.data_ptr()}", grid, x.device) if block_trace.ON else None
    mod.launch(name, grid, warps * 32, (warps * 32 * floats + sq_tiles) * 4,
               [Ptr(x.data_ptr()), Ptr(w.data_ptr()), Ptr(out.data_ptr()), Ptr(mod.ws.data_ptr()),
                Ptr(mod.counters.data_ptr()), m, n, k, Ptr(a), a_bytes, Ptr(b), b_bytes, Ptr(aux), eps,
                Ptr(trace.data_ptr() if trace is not None else 0), Ptr(sq), sq_tiles])
    return out


def _squares_fit(t: torch.Tensor, shape: tuple, plan_ok: bool) -> bool:
    """Whether the kernel can read or write this squares tensor: float32, contiguous, 16-byte aligned (cp.async), of
    `shape`, for a launch that takes them (`takes_squares`)."""
    return (plan_ok and t.dtype == torch.float32 and t.is_contiguous() and t.data_ptr() % 16 == 0
            and tuple(t.shape) == shape and t.device.type == "cuda")


def _check_squares(t: torch.Tensor, shape: tuple, plan_ok: bool) -> None:
    if not _squares_fit(t, shape, plan_ok):
        raise ValueError(f"squares {tuple(t.shape)} {t.dtype}: not a float32 {shape} tensor this launch takes")


def reads_squares(x: torch.Tensor, w: torch.Tensor, squares: torch.Tensor) -> bool:
    """Whether `skinny_linear(x, w, norm=..., squares=squares)` on its default plan takes these squares."""
    m, k = x.shape
    return _squares_fit(squares, (1, k // 8), m == 1 and (k // 8) % 4 == 0 and takes_squares(m, w.shape[0], k))


def takes_squares(m: int, n: int, k: int) -> bool:
    """Whether the product of m rows with an [n, k] weight runs on 8-row tiles (`plan`): the only ones with
    `skinny_linear`'s squares and squares_out."""
    return m <= 8 and _unpack(plan(m, n, k))[3] == "tile8"


def unavailable_reason(device: torch.device) -> str | None:
    state = cubin.tried("skinny_gemm.cu", device)
    return state if isinstance(state, str) else None
