"""Reference tensor operations (torch, any device).

These are the semantics every fast kernel is checked against. Models call only
these names, so a device-specific fast path can replace them without touching
the model code.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from .. import tuning

_kernels = None  # the Triton module once imported, False where unavailable or disabled (the `kernels` knob)


def fast_kernels(x: torch.Tensor):
    """The fused Triton kernels when `x` is a half-precision CUDA tensor and they are available."""
    if x.dtype not in (torch.bfloat16, torch.float16):
        return None
    return _triton_on(x)


def _triton_on(x: torch.Tensor):
    """The fused Triton kernels' module when `x` is on a CUDA device and they are available (any dtype)."""
    global _kernels
    if not x.is_cuda:
        return None
    if _kernels is None:
        try:
            if not tuning.KNOBS.kernels:
                raise ImportError("disabled")
            from ..kernels import elementwise as _kernels_module

            _kernels = _kernels_module
        except ImportError:
            _kernels = False
    return _kernels or None


def model_kernels(x: torch.Tensor, name: str):
    """A model's own Triton kernels, the module kernels/<name> (dflash2: DFlash 2's convolution and selector;
    delta_rule: a hybrid's DeltaNet rows and rewind; sampling: the sampler's top-k rows and verdict), where the Triton
    kernels run on tensors like x, in any dtype (a float32 recurrent state, say): CUDA, the kernels available, neither
    the `kernels` knob nor `reference_only` turning them off. Else None: that model's torch code is then the path
    (and the reference its kernels are checked against)."""
    if not _triton_on(x):
        return None
    module = _model_kernels.get(name)
    if module is None:
        module = _model_kernels[name] = importlib.import_module(f"..kernels.{name}", __package__)
    return module


_model_kernels: dict = {}


def stage_step(ids: torch.Tensor, src: torch.Tensor, positions: torch.Tensor, start: int, offset=None,
               fill: int = 0) -> bool:
    """ids[:len(src)] = src, the rest of ids = fill, and positions[:] = start (+ offset[0], a device scalar),
    start + 1, ... in one GPU kernel (kernels/elementwise.stage_step); False, and nothing done, where the Triton
    kernels do not run."""
    kernels = _triton_on(ids)
    if not kernels:
        return False
    kernels.stage_step(ids, src, positions, start, offset, fill)
    return True


@contextmanager
def reference_only():
    """The torch reference path for everything inside (training: the Triton kernels have no backward)."""
    global _kernels
    saved, _kernels = _kernels, False
    try:
        yield
    finally:
        _kernels = saved


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if (k := fast_kernels(x)) and x.dtype == weight.dtype:
        return k.rms_norm(x, weight, eps)
    if x.dtype == weight.dtype == torch.float32:  # the same values in one op (a CPU step runs ~33 norms)
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    return weight * unit_rms_norm(x, eps)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, then=None,
           norm: float | None = None, residual: torch.Tensor | None = None,
           squares: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias). then: the weight the model reads next (a tensor, or a tuple of row blocks read side
    by side), whose first rows the CUDA GEMM fetches into L2 after its own (`warm_ranges`); a hint only.
    norm (eps): the product of x through an RMSNorm without weight (`unit_rms_norm`; a model folds the norm's
    weight into `weight`). residual: residual + the product. Where the CUDA GEMM takes the product
    (`fuses_norms`), both happen inside it. squares: with norm, x's partial sums of squares from the product that
    wrote it (`linear_squares`), which the CUDA GEMM's norm then uses instead of summing x's squares itself; None,
    or any other path: the norm is computed from x."""
    if bias is None and (gemm := fast_gemm(x, weight)) is not None:
        if _cuda_gemm and gemm is _cuda_gemm.skinny_linear:  # the Triton kernel has no warm-up
            return _on_cuda_gemm(x, weight, then, norm, residual, squares=squares)
        out = gemm(_normed(x, norm), weight)
    else:
        out = F.linear(_normed(x, norm), weight, bias)
    return out if residual is None else residual + out


def _on_cuda_gemm(x: torch.Tensor, weight: torch.Tensor, then, norm: float | None, residual: torch.Tensor | None = None,
                  swiglu: bool = False, squares: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` (or with swiglu, `swiglu`) on the CUDA GEMM: the norm and residual add inside it where it can
    take them (`_fusable`), else around it."""
    if _fusable(norm, residual, x, weight):
        if squares is not None and not _cuda_gemm.reads_squares(x, weight, squares):
            squares = None
        return _cuda_gemm.skinny_linear(x, weight, swiglu=swiglu, warm=warm_ranges(then), norm=norm, residual=residual,
                                        squares=squares)
    out = _cuda_gemm.skinny_linear(_normed(x, norm), weight, swiglu=swiglu, warm=warm_ranges(then))
    return out if residual is None else residual + out


def linear_squares(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                   then=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`linear(x, weight, then=then, residual=residual)` and, where the CUDA GEMM takes the residual add in
    (`fuses_squares`), the partial sums of squares of the result's rows that a norm of it can use (`linear`'s
    squares): float32 [rows, N / 8]. None elsewhere."""
    gemm = fast_gemm(x, weight) if fuses_squares(x) and _fusable(None, residual, x, weight) else None
    if _cuda_gemm and gemm is _cuda_gemm.skinny_linear and _cuda_gemm.takes_squares(x.shape[0], *weight.shape):
        sq = torch.empty((x.shape[0], weight.shape[0] // 8), dtype=torch.float32, device=x.device)
        out = _cuda_gemm.skinny_linear(x, weight, warm=warm_ranges(then), residual=residual, squares_out=sq)
        return out, sq
    return linear(x, weight, then=then, residual=residual), None


def _normed(x: torch.Tensor, eps: float | None) -> torch.Tensor:
    return x if eps is None else unit_rms_norm(x, eps)


def unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm with a weight of ones (the weight folded into the next product): the same values and roundings.
    Normalised in float32 like the reference implementations, then rounded to x's dtype (rms_norm scales that)."""
    if x.dtype == torch.float32:  # the same values in one op
        return F.rms_norm(x, x.shape[-1:], eps=eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# Steps of at least this many rows run every norm and residual add inside the products (a DFlash verify, 16 rows):
# at 8 rows that lost, and gate/up streams slower with its norm inside (docs/TUNING.md).
_NORMS_FUSED_MIN_ROWS = 9
# Fewer rows, from this many, run the qkv product's norm and the down product's residual add inside them, and keep
# the add + norm kernel before gate/up (`fuses_mlp_norm`): that won at every row count (docs/TUNING.md).
_QKV_NORM_MIN_ROWS = 1


def _fusable(norm, residual, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the CUDA GEMM (which takes x and weight) can fold this norm or residual add in."""
    if norm is not None and residual is not None:
        return False
    return (residual is None or (residual.shape == (x.shape[0], weight.shape[0]) and residual.dtype == x.dtype
                                 and residual.is_contiguous()))


def folds_norms(device, dtype: torch.dtype) -> bool:
    """Whether a model loaded on this device in this dtype should fold its layers' norm weights into the products
    after them (models/decoder.fold_norms): where the CUDA GEMM is available, its products then run the norms and
    the residual adds of a step's few rows inside them (`fuses_norms`)."""
    device = torch.device(device)
    if not (tuning.KNOBS.gemm == "auto" and dtype == torch.bfloat16 and device.type == "cuda"
            and tuning.KNOBS.kernels and _kernels is not False):
        return False
    return bool(_load_cuda_gemm(device))


def fuses_norms(h: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether products of rows like h with weights like `weight` (a layer's) run in the CUDA GEMM with the
    norm before them and the residual add after them inside (`linear`'s norm and residual): a model then
    skips the fused add + norm kernels between its products (all of them where `fuses_mlp_norm`)."""
    return (h.shape[0] >= _QKV_NORM_MIN_ROWS and tuning.KNOBS.gemm == "auto" and weight.shape[0] < VOCAB_ROWS
            and _skinny(h, weight) and _cuda_gemm_for(h, weight) is not None)


def fuses_squares(h: torch.Tensor) -> bool:
    """Whether steps of h's rows (where `fuses_norms` and not `fuses_mlp_norm`; the caller checks) hand the norm's
    partial sums of squares from the products that write the residual stream (o, down) to those that normalise it
    (gate/up, the next layer's qkv: `linear_squares`; csrc/skinny_gemm.cu, SQUARES / SCALE), instead of keeping the
    add + norm kernel before gate/up: one row, a decode step."""
    return h.shape[0] == 1


def fuses_mlp_norm(h: torch.Tensor) -> bool:
    """Where `fuses_norms`: whether the norm before gate/up (and o's residual add) runs inside the products too,
    or keeps its add + norm kernel."""
    return h.shape[0] >= _NORMS_FUSED_MIN_ROWS


# Bytes of the next weight warmed into L2 after a product: 4 MB was the fastest of 0-16 MB (docs/TUNING.md).
_WARM_BYTES = 4 << 20


def warm_ranges(then) -> tuple:
    """(address, bytes) of the first rows of each block of `then`, _WARM_BYTES in all (see `linear`)."""
    if then is None or _WARM_BYTES <= 0:
        return ()
    parts = then if isinstance(then, (tuple, list)) else (then,)
    each = (_WARM_BYTES // len(parts)) & ~4095
    return tuple((p.data_ptr(), min(each, p.numel() * p.element_size()) & ~15) for p in parts
                 if p.is_contiguous())


def logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float32 logits of x over a vocabulary head: linear(x, weight).float(), with the vocabulary head's
    kernel writing them widened itself (no conversion kernel over [rows, vocab] after it)."""
    if weight.shape[0] >= VOCAB_ROWS and (gemm := fast_gemm(x, weight)) is not None:
        return gemm(x, weight, out_dtype=torch.float32)
    return linear(x, weight).float()


# Rows up to which the `auto` GEMM is the CUDA kernel (all a skinny product has): from 9 rows it matches cuBLAS per
# product and, in a step's graph, overlaps its neighbours (docs/TUNING.md).
_GEMM_MAX_M = 16
_cuda_gemm = None  # csrc/skinny_gemm.cu once built, False where unavailable
VOCAB_ROWS = 32768  # weights this tall are vocabulary heads


def fast_gemm(x: torch.Tensor, w: torch.Tensor):
    """The skinny GEMM for bf16 CUDA rows (M <= 16) where one measured faster than cuBLAS, else None.

    H100, in CUDA graphs (benchmarks/gemm_bench.py): the Triton kernel streams the vocabulary head at
    ~3.0 TB/s against cuBLAS's 2.5; the CUDA kernel (csrc/) prefetches its weights across kernel
    boundaries (programmatic dependent launch), which cuBLAS cannot, on the per-layer matrices."""
    if not _skinny(x, w):
        return None
    if tuning.KNOBS.gemm == "triton" or w.shape[0] >= VOCAB_ROWS:
        from ..kernels.skinny_gemm import skinny_linear

        return skinny_linear
    gemm = _cuda_gemm_for(x, w)
    return gemm.skinny_linear if gemm else None


def _skinny(x: torch.Tensor, w: torch.Tensor) -> bool:
    """A bf16 CUDA product of at most 16 rows that a skinny GEMM may take."""
    return (tuning.KNOBS.gemm != "cublas" and x.is_cuda and x.dtype == torch.bfloat16 and x.dim() == 2
            and x.shape[0] <= 16 and w.dtype == x.dtype and _kernels is not False and x.is_contiguous()
            and w.is_contiguous())


def _cuda_gemm_for(x: torch.Tensor, w: torch.Tensor):
    """The csrc/ GEMM module when it takes this product (after `_skinny`), else None."""
    if x.shape[0] > _GEMM_MAX_M:
        return None
    if _cuda_gemm is None and torch.cuda.is_current_stream_capturing():
        return None  # the first use builds and allocates: never inside a capture
    gemm = _load_cuda_gemm(x.device)
    return gemm if gemm and gemm.supports(x, w) else None


def _load_cuda_gemm(device: torch.device):
    """The csrc/ GEMM module, built and loaded on first use; False where it is unavailable."""
    global _cuda_gemm
    if _cuda_gemm is None:
        from ..kernels import cuda_gemm

        _cuda_gemm = cuda_gemm if cuda_gemm.available(device) else False
    return _cuda_gemm


def swiglu(x: torch.Tensor, gate_up: torch.Tensor, then=None, norm: float | None = None,
           squares: torch.Tensor | None = None) -> torch.Tensor:
    """An MLP's first half: silu(x @ gate^T) * (x @ up^T) with gate_up = [gate; up] ([2I, H]) -> [T, I].
    Where the CUDA GEMM takes the product, the activation runs in its epilogue (no kernel of its own).
    then, norm, squares: as in `linear`."""
    if (tuning.KNOBS.gemm == "auto" and gate_up.shape[0] < VOCAB_ROWS and _skinny(x, gate_up)
            and _cuda_gemm_for(x, gate_up) is not None):
        return _on_cuda_gemm(x, gate_up, then, norm, swiglu=True, squares=squares)
    return silu_mul(linear(x, gate_up, then=then, norm=norm))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [rows, V] -> long [rows]: each row's first index of its largest value (torch.argmax)."""
    if _triton_on(logits) and logits.dim() == 2 and logits.stride(-1) == 1:
        from ..kernels import greedy

        return greedy.argmax_rows(logits)
    return logits.argmax(-1)


def greedy_verdict(ids: torch.Tensor, logits: torch.Tensor, feed=None) -> torch.Tensor:
    """Greedy acceptance of a verified span in one long tensor: ids [k+1] = [last, drafts...] and their logits
    [k+1, V] -> [n, bonus, drafts...], n the drafts that agree with the target's argmax before the first that
    does not, bonus the target's argmax at row n (the token after them). Two kernels on the GPU.
    feed = (positions [1], fed [max_len + 1]), one row only: the bonus also becomes the row's next input, in place
    (ids[0] = bonus, positions[0] += 1), and is recorded at fed[position + 1], so that a graph's next replay needs
    nothing staged and the host can read the token where nothing overwrites it (graphs.Graphs.fed_token)."""
    if _triton_on(logits) and logits.dim() == 2 and logits.stride(-1) == 1 and ids.is_contiguous():
        from ..kernels import greedy

        return greedy.greedy_verdict(ids, logits, feed)
    best = logits.argmax(-1)
    drafts = ids[1:]
    n = (drafts == best[:-1]).to(torch.int64).cumprod(0).sum()
    out = torch.cat([n.view(1), best.index_select(0, n.view(1)), drafts])
    feed_token(ids, out[1:2], feed)
    return out


def feed_token(ids: torch.Tensor, token: torch.Tensor, feed) -> None:
    """A one-row step's token [1] on to its next replay, as greedy_verdict's `feed` (None: nothing): the row's next
    input (ids[0] = token, positions[0] += 1), recorded at fed[position + 1]."""
    if feed is not None:
        positions, fed = feed
        fed.index_copy_(0, positions + 1, token)
        ids.copy_(token)
        positions.add_(1)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if (k := fast_kernels(gate_up)) and gate_up.dim() == 2 and gate_up.stride(-1) == 1:
        return k.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """The residual update and the next norm in one: (h + delta, rms_norm(h + delta))."""
    if (k := fast_kernels(h)) and h.dim() == 2 and h.dtype == delta.dtype == weight.dtype:
        return k.add_rms_norm(h, delta, weight, eps)
    h = h + delta
    return h, rms_norm(h, weight, eps)


def _rope_kernel_fits(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The Triton RoPE kernels load each half of a head at once: head_dim/2 must be a power of two; the tables'
    columns (the rotated dims: all of them, or a partial RoPE's first) even and at most head_dim."""
    half, rotary = x.shape[-1] // 2, cos.shape[-1]
    return (x.shape[-1] % 2 == 0 and half > 0 and half & (half - 1) == 0 and x.stride(-1) == 1
            and 0 < rotary <= x.shape[-1] and rotary % 2 == 0 and cos.is_contiguous() and sin.is_contiguous())


def qk_norm_rope(q, k, q_weight, k_weight, eps: float, cos, sin):
    """Per-head RMSNorm of q [T, H, D] and k [T, KV, D], then RoPE at the rows' positions (cos/sin [T, R]: their
    first R dims, as `apply_rope`)."""
    if (kk := fast_kernels(q)) and q.dtype == q_weight.dtype and k.stride(-1) == 1 and _rope_kernel_fits(q, cos, sin):
        return kk.qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin)
    return apply_rope(rms_norm(q, q_weight, eps), cos, sin), apply_rope(rms_norm(k, k_weight, eps), cos, sin)


def _rope_write_fits(q, k, v, q_weight, cos, sin, k_cache, v_cache) -> bool:
    """Whether a GPU kernel can norm, rotate and store these rows: one dtype, unit-stride heads, contiguous caches."""
    return (q.dtype == q_weight.dtype == k_cache.dtype and k.stride(-1) == 1 and v.stride(-1) == 1
            and k_cache.is_contiguous() and v_cache.is_contiguous() and _rope_kernel_fits(q, cos, sin))


def qk_norm_rope_write(q, k, v, q_weight, k_weight, eps: float, cos, sin, k_cache, v_cache, positions):
    """qk_norm_rope at `positions` (device int64 [T]; cos/sin are the whole tables [max_positions, R]), then
    k and v stored in one layer's cache [max_len, KV, D] at them; returns q. One kernel on the GPU instead of
    five (two table gathers, the norm + RoPE, two cache writes)."""
    if (kk := fast_kernels(q)) and _rope_write_fits(q, k, v, q_weight, cos, sin, k_cache, v_cache):
        return kk.qk_norm_rope_write(q, k, v, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, positions)
    cos, sin = cos.index_select(0, positions), sin.index_select(0, positions)
    q, k = qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin)
    k_cache.index_copy_(0, positions, k)
    v_cache.index_copy_(0, positions, v)
    return q


def attend_fresh(q, k, v, q_weight, k_weight, eps: float, cos, sin, k_cache, v_cache, positions, window: int,
                 limit, scale: float, then=None, low=None, gate=None) -> torch.Tensor:
    """qk_norm_rope_write (q, k, v straight from the projection; positions consecutive), then attention_window
    over the cache's first `window` rows with `limit`. One kernel on the GPU where the rows fit: the attention's
    split programs normalise and rotate q and the new keys themselves. then: the weight read after the attention,
    whose first rows a decode row's split programs ask into L2 once their keys are in (the caller names it where the
    product before the attention did not warm them). low: as attention_window's. gate [T, H*D] or None: the output
    `output_gate`d, by the attention's last kernel on the GPU (its merge)."""
    if fast_kernels(q) and _rope_write_fits(q, k, v, q_weight, cos, sin, k_cache, v_cache):
        from ..kernels import attention as kernel

        if kernel.supports_fresh(q, k_cache, window) and (gate is None or gate.stride(-1) == 1):
            return kernel.attention_fresh(q, k, v, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, positions,
                                          window, limit, scale, split_warm(then), low, gate=gate)
    q = qk_norm_rope_write(q, k, v, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, positions)
    out = attention_window(q, k_cache[:window], v_cache[:window], limit, scale, low)
    return out if gate is None else output_gate(out, gate)


def output_gate(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """An attention output [T, H*D] times sigmoid(gate) [T, H*D], per head and dim (Qwen3.5's gated attention)."""
    return out * torch.sigmoid(gate)


# Bytes of the weight read after an attention (the o projection) that a decode row's split programs ask into L2 once
# their keys are in, where the product before the attention did not warm its first rows (long windows: the qkv
# product warms the keys instead, models/decoder.KV_WARM_WINDOW). Requests made after the keys' do not delay them.
# 8 MB was the fastest of 0-20 MB (docs/TUNING.md).
_SPLIT_WARM_BYTES = 8 << 20


def split_warm(then):
    """(`then` as bytes, how many of its first to warm) for the attention's split programs, or None."""
    if then is None or _SPLIT_WARM_BYTES <= 0 or not then.is_contiguous():
        return None
    flat = then.reshape(-1).view(torch.uint8)
    n = min(_SPLIT_WARM_BYTES, flat.numel()) & ~15
    return (flat, n) if n > 0 else None


def k_norm_rope_write_layers(k, v, k_weights, eps: float, cos, sin, k_cache, v_cache, positions) -> None:
    """Context rows of several layers at once: each layer's keys RMSNormed (k_weights [L, D]) and rotated at
    `positions` (device int64 [T]; cos/sin whole tables), then keys and values stored at those positions.
    k, v: [T, L, KV, D]; caches [L, max_len, KV, D]. One kernel on the GPU instead of four per layer."""
    if ((kk := fast_kernels(k)) and _rope_write_fits(k, k, v, k_weights, cos, sin, k_cache, v_cache)
            and k_weights.is_contiguous()):
        return kk.k_norm_rope_write_layers(k, v, k_weights, eps, cos, sin, k_cache, v_cache, positions)
    cos, sin = cos.index_select(0, positions), sin.index_select(0, positions)
    for i in range(k.shape[1]):
        k_cache[i].index_copy_(0, positions, apply_rope(rms_norm(k[:, i], k_weights[i], eps), cos, sin))
        v_cache[i].index_copy_(0, positions, v[:, i])


def rope_tables(head_dim: int, theta: float, max_positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_positions, head_dim] in float32 (half-split layout). A partial RoPE's (Qwen3.5) are its
    rotary dims' tables: head_dim the rotary dim."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    pos = torch.arange(max_positions, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, R] float32 rows for x's positions. R < D: a partial RoPE, which rotates the
    first R dims and passes the others through."""
    if (k := fast_kernels(x)) and _rope_kernel_fits(x, cos, sin):
        return k.apply_rope(x, cos, sin)
    r = cos.shape[-1]
    rot = x[..., :r]
    half = r // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    # float32: the sum inside the second product's op (one op fewer, one rounding fewer); half precision keeps the two
    # roundings its kernels are checked against
    out = torch.addcmul(rot * cos, rotated, sin) if x.dtype == torch.float32 else rot * cos + rotated * sin
    return out if r == x.shape[-1] else torch.cat([out, x[..., r:]], dim=-1)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offset: int,
    causal: bool,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q: [T, H, D]; k, v: [S, KV, D] with grouped heads. Returns [T, H*D].

    With `causal`, query i sits at key position q_offset + i and sees keys up to it. With `window` (a sliding
    layer), it sees only keys less than `window` positions away: before it, and without `causal` after it too.
    """
    t, h, d = q.shape
    s, kvh, _ = k.shape
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, T or S, D]
    # Grouped heads: SDPA's own grouping on the CPU, which copies nothing; CUDA's masked kernels take equal head
    # counts only, so the keys and values are repeated there.
    gqa = not q.is_cuda
    if not gqa:
        kh = kh.repeat_interleave(h // kvh, dim=0)
        vh = vh.repeat_interleave(h // kvh, dim=0)
    if causal and q_offset == 0 and t == s and window is None:
        # A whole prompt from position 0: the plain causal form (no mask tensor, equal head counts)
        # lets SDPA use its flash kernel instead of materialising [heads, T, T] scores.
        # 4-D [batch, heads, T, D]: with 3-D inputs SDPA falls back to its math kernel.
        out = F.scaled_dot_product_attention(qh[None], kh[None], vh[None], is_causal=True, scale=scale,
                                             enable_gqa=gqa)[0]
        return out.transpose(0, 1).reshape(t, h * d)
    mask = None
    if causal or window is not None:
        qpos = torch.arange(t, device=q.device)[:, None] + q_offset
        kpos = torch.arange(s, device=q.device)[None, :]
        mask = kpos <= qpos if causal else kpos < qpos + (window or 0)
        if window is not None:
            mask = mask & (kpos > qpos - window)
    out = F.scaled_dot_product_attention(qh[None], kh[None], vh[None], attn_mask=mask, scale=scale, enable_gqa=gqa)[0]
    return out.transpose(0, 1).reshape(t, h * d)


def attention_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q: [T, H, D]; k, v: [S, KV, D]; visible: [T, S] bool. Returns [T, H*D].

    Shapes never depend on the sequence length, so this runs inside a CUDA graph
    whose positions live in device memory.
    """
    t, h, d = q.shape
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=visible, scale=scale, enable_gqa=True)[0]
    return out.transpose(0, 1).reshape(t, h * d)


def attention_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, limit: torch.Tensor,
                     scale: float, low: torch.Tensor | None = None) -> torch.Tensor:
    """q: [T, H, D]; k, v: [S, KV, D] (a fixed window of the cache); limit: [T] device int64,
    the last key index query row i sees; low (a sliding layer): [T] device int64, the first. Returns [T, H*D].
    Capturable in a CUDA graph."""
    if fast_kernels(q):
        from ..kernels import attention as kernel

        if kernel.supports(q, k, v):
            return kernel.attention_window(q, k, v, limit, scale, low)
        from ..kernels import prefill_attention as many_rows  # rows past the split kernel's tile: a prefill

        if many_rows.supports(q, k, v):
            return many_rows.attention_window(q, k, v, limit, scale, low)
    keys = torch.arange(k.shape[0], device=k.device)[None, :]
    visible = keys <= limit[:, None]
    if low is not None:
        visible = visible & (keys >= low[:, None])
    return attention_masked(q, k, v, visible, scale)
