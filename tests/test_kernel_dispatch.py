"""Which shapes ops.py hands to the fused kernels (the rest fall back to the torch reference).

The dispatch is checked on CPU with a stand-in kernel module; the kernels themselves are
checked in test_kernels_interpret.py and on the GPU.
"""

import pytest
import torch

from dflash_cli import tuning
from dflash_cli.layers import ops


class FakeKernels:
    def __init__(self):
        self.calls = []

    def apply_rope(self, x, cos, sin):
        self.calls.append("apply_rope")
        return x

    def qk_norm_rope(self, q, k, qw, kw, eps, cos, sin):
        self.calls.append("qk_norm_rope")
        return q, k

    def rms_norm(self, x, w, eps):  # the fallback's norm: not under test, the reference
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.fixture
def fake(monkeypatch):
    kernels = FakeKernels()
    monkeypatch.setattr(ops, "fast_kernels", lambda x: kernels)
    return kernels


@pytest.mark.parametrize("d,fused", [(16, True), (128, True), (24, False), (80, False), (96, False)])
def test_rope_kernels_need_a_power_of_two_half_head(fake, d, fused):
    """tl.arange(0, head_dim // 2) needs a power of two: head_dim 80 or 96 goes to torch."""
    cos, sin = ops.rope_tables(d, 10000.0, 8, "cpu")
    c, s = cos[2:5].contiguous(), sin[2:5].contiguous()
    q, k = torch.randn(3, 4, d), torch.randn(3, 2, d)
    w = torch.ones(d)
    out = ops.apply_rope(q, c, s)
    qo, ko = ops.qk_norm_rope(q, k, w, w, 1e-6, c, s)
    assert fake.calls == (["apply_rope", "qk_norm_rope"] if fused else [])
    if not fused:
        ref_q = ops.apply_rope(fake.rms_norm(q, w, 1e-6), c, s)
        assert out.shape == q.shape and torch.allclose(qo, ref_q) and ko.shape == k.shape


def test_qk_norm_rope_needs_unit_stride_keys(fake):
    cos, sin = ops.rope_tables(16, 10000.0, 4, "cpu")
    q, w = torch.randn(3, 4, 16), torch.ones(16)
    k = torch.randn(3, 2, 32)[..., ::2]  # last-dim stride 2
    ops.qk_norm_rope(q, k, w, w, 1e-6, cos[:3].contiguous(), sin[:3].contiguous())
    assert "qk_norm_rope" not in fake.calls  # the unfused path (its normed q/k are contiguous again)


def test_window_attention_kernel_needs_unit_stride_values(monkeypatch):
    pytest.importorskip("triton")
    from dflash_cli.kernels import attention as kernel

    q, k = torch.randn(1, 4, 64), torch.randn(300, 2, 64)
    v = torch.randn(300, 2, 64)
    assert kernel.supports(q, k, v)
    strided = torch.randn(300, 2, 128)[..., ::2]
    assert not kernel.supports(q, k, strided)

    def refuse(*a, **kw):
        raise AssertionError("the kernel was given a strided v")

    monkeypatch.setattr(ops, "fast_kernels", lambda x: object())
    monkeypatch.setattr(kernel, "attention_window", refuse)
    limit = torch.tensor([200])
    got = ops.attention_window(q, k, strided, limit, 0.125)
    vis = torch.arange(300)[None, :] <= limit[:, None]
    assert torch.allclose(got, ops.attention_masked(q, k, strided.contiguous(), vis, 0.125), atol=1e-6)


@pytest.mark.parametrize("tokens,heads,kv,fresh", [(1, 32, 8, True), (4, 32, 8, True), (8, 32, 8, True),
                                                   (9, 32, 8, False), (16, 32, 8, False), (8, 24, 8, False),
                                                   (5, 24, 8, True)])
def test_fresh_attention_takes_decode_rows_and_short_spans(tokens, heads, kv, fresh):
    """The split kernel normalises and rotates q itself for up to 16 query rows per KV head, and for spans of up to
    32 whose tokens fill 16-row blocks (a group of 3 heads does not) over windows of up to 2048 keys; longer spans
    and longer windows keep the RoPE kernel."""
    pytest.importorskip("triton")
    from dflash_cli.kernels import attention as kernel

    q, cache = torch.randn(tokens, heads, 128), torch.randn(8192, kv, 128)
    assert kernel.supports_fresh(q, cache, 2048) == fresh
    assert kernel.supports_fresh(q, cache, 4096) == (fresh and tokens * heads // kv <= 16)  # long windows: spans not


def test_warm_ranges_cover_the_first_rows_of_each_block(monkeypatch):
    """The L2 warm-up after a product: the budget split over the blocks read side by side (gate and up),
    clipped to each block, in whole 16-byte granules; nothing when off or when there is no next weight."""
    from dflash_cli.models.decoder import DecoderLayer, mlp_rows

    monkeypatch.setattr(ops, "_WARM_BYTES", 1 << 20)
    gate_up = torch.zeros(2 * 1024, 512, dtype=torch.bfloat16)  # 2 MiB: gate rows, then up rows
    layer = DecoderLayer(qkv=None, qkv_bias=None, o=None, gate_up=gate_up, down=None, input_norm=None,
                         post_norm=None, q_norm=None, k_norm=None)
    (a, a_bytes), (b, b_bytes) = ops.warm_ranges(mlp_rows(layer))
    assert (a, b) == (gate_up.data_ptr(), gate_up[1024:].data_ptr()) and a_bytes == b_bytes == 1 << 19
    small = torch.zeros(3, 7, dtype=torch.bfloat16)  # 42 bytes: its whole granules only
    assert ops.warm_ranges(small) == ((small.data_ptr(), 32),)
    assert ops.warm_ranges(None) == ()
    monkeypatch.setattr(ops, "_WARM_BYTES", 0)
    assert ops.warm_ranges(gate_up) == ()


def test_qkv_warms_the_layer_keys_over_long_windows(monkeypatch):
    """After the qkv product the GPU warms the o projection's rows, or over a window longer than KV_WARM_WINDOW
    the first rows of the layer's cached keys and values (each half of the budget); eager spans, which have no
    window, keep o."""
    from dflash_cli.layers.kv_cache import KVCache
    from dflash_cli.layers.spans import Span, StaticSpan
    from dflash_cli.models import decoder

    monkeypatch.setattr(ops, "_WARM_BYTES", 4 << 20)  # the default
    o = torch.zeros(64, 32, dtype=torch.bfloat16)
    layer = decoder.DecoderLayer(qkv=None, qkv_bias=None, o=o, gate_up=None, down=None, input_norm=None,
                                 post_norm=None, q_norm=None, k_norm=None)
    cache = KVCache.allocate(2, 9000, 8, 128, torch.bfloat16, "cpu")
    cos = sin = torch.zeros(9000, 128)
    positions = torch.tensor([decoder.KV_WARM_WINDOW - 1])  # inside both windows below
    long = StaticSpan(cache, positions, decoder.KV_WARM_WINDOW + 256, cos, sin)
    k, v = decoder.read_after_qkv(layer, long, 1)
    assert k.data_ptr() == cache.k[1].data_ptr() and v.data_ptr() == cache.v[1].data_ptr()
    (ka, k_bytes), (va, v_bytes) = ops.warm_ranges((k, v))
    assert (ka, va) == (cache.k[1].data_ptr(), cache.v[1].data_ptr()) and k_bytes == v_bytes == 2 << 20
    short = StaticSpan(cache, positions, decoder.KV_WARM_WINDOW, cos, sin)
    assert decoder.read_after_qkv(layer, short, 1) is o
    assert decoder.read_after_qkv(layer, Span(cache, decoder.KV_WARM_WINDOW - 1, 1, cos, sin), 1) is o


def test_the_split_warms_o_where_qkv_did_not(monkeypatch):
    """A decode row's attention is handed o to warm (ops.split_warm: its first bytes, whole 16-byte granules) only
    over windows where the qkv product warmed the keys instead (read_after_qkv)."""
    from types import SimpleNamespace

    from dflash_cli.layers.kv_cache import KVCache
    from dflash_cli.models import decoder

    o = torch.zeros(64, 32, dtype=torch.bfloat16)  # 4096 bytes
    monkeypatch.setattr(ops, "_SPLIT_WARM_BYTES", 1000)
    flat, n = ops.split_warm(o)
    assert flat.dtype == torch.uint8 and flat.data_ptr() == o.data_ptr() and n == 992
    monkeypatch.setattr(ops, "_SPLIT_WARM_BYTES", 8 << 20)
    assert ops.split_warm(o)[1] == 4096 and ops.split_warm(None) is None
    monkeypatch.setattr(ops, "_SPLIT_WARM_BYTES", 0)
    assert ops.split_warm(o) is None

    cfg = SimpleNamespace(head_dim=8, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6)
    layer = decoder.DecoderLayer(qkv=None, qkv_bias=None, o=o, gate_up=None, down=None, input_norm=None,
                                 post_norm=None, q_norm=None, k_norm=None)
    monkeypatch.setattr(ops, "linear", lambda x, w, b=None, **kw: torch.zeros(x.shape[0], 64))
    handed = []

    class Recorder:
        def __init__(self, window):
            self.window, self.cache = window, KVCache.allocate(2, 16, 2, 8, torch.bfloat16, "cpu")

        def attend_fresh(self, layer, q, k, v, q_norm, k_norm, eps, scale, then=None):
            handed.append(then)
            return q.reshape(q.shape[0], -1)

    x = torch.zeros(1, 16)
    decoder.self_attention(layer, x, cfg, Recorder(decoder.KV_WARM_WINDOW + 1), 1, 1.0)
    decoder.self_attention(layer, x, cfg, Recorder(decoder.KV_WARM_WINDOW), 1, 1.0)
    assert handed[0] is o and handed[1] is None


def test_knobs_are_read_once_and_name_themselves_when_malformed():
    from dflash_cli.errors import DflashError

    knobs = tuning.read({})
    assert knobs == tuning.Tuning() and knobs.graphs and knobs.pdl and knobs.gemm == "auto" and not knobs.block_trace
    knobs = tuning.read({"DFLASH_GRAPHS": "0", "DFLASH_GEMM": "cublas", "DFLASH_REGISTRY": "/x/models.toml"})
    assert not knobs.graphs and knobs.gemm == "cublas" and str(knobs.registry) == "/x/models.toml"
    with pytest.raises(DflashError, match="DFLASH_PDL='yes': must be 0 or 1"):
        tuning.read({"DFLASH_PDL": "yes"})
    with pytest.raises(DflashError, match="DFLASH_GEMM='cutlass': must be one of auto, cublas, triton"):
        tuning.read({"DFLASH_GEMM": "cutlass"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_norm_and_residual_are_the_composition_off_the_gpu(dtype):
    """linear's norm (a unit-weight RMSNorm before) and residual (the add after) mean what they say; the CUDA
    GEMM folds them in. A unit-weight norm is rms_norm with a weight of ones, bit for bit."""
    torch.manual_seed(0)
    h, w, r = torch.randn(3, 64, dtype=dtype), torch.randn(48, 64, dtype=dtype), torch.randn(3, 48, dtype=dtype)
    normed = ops.unit_rms_norm(h, 1e-6)
    assert torch.equal(normed, ops.rms_norm(h, torch.ones(64, dtype=dtype), 1e-6))
    assert torch.equal(ops.linear(h, w, norm=1e-6), ops.linear(normed, w))
    assert torch.equal(ops.linear(h, w, residual=r), r + ops.linear(h, w))
    assert torch.equal(ops.swiglu(h, w, norm=1e-6), ops.swiglu(normed, w))
    assert not ops.fuses_norms(h, w) and not ops.folds_norms("cpu", dtype)


def test_block_trace_is_off_unless_asked(monkeypatch):
    # Off (the default), a traced launch gets no buffer and the kernels compile without the trace; on, each launch
    # keeps a buffer of its own, one record per block, in launch order.
    from dflash_cli.kernels import block_trace

    like = torch.zeros(3)
    monkeypatch.setattr(block_trace, "ON", False)
    assert block_trace.buffer("gemm:1", (8,), like.device) is None
    assert block_trace.args("split", (4, 2), like) == {"trace_ptr": like, "TRACE": False}
    monkeypatch.setattr(block_trace, "ON", True)
    block_trace.clear()
    try:
        traced = block_trace.args("merge", (5, 2, 1), like)
        assert traced["TRACE"] and traced["trace_ptr"].shape == (10, block_trace.FIELDS)
        assert [kind for kind, _ in block_trace.launches()] == ["merge"]
    finally:
        block_trace.clear()


def test_decode_splits_of_several_key_blocks_pipeline_two_stages(monkeypatch):
    """Two programs of a long decode split must fit an SM within the step's carveout; spans keep Triton's stages."""
    pytest.importorskip("triton")
    from dflash_cli.kernels import attention as kernel

    for name, value in (("SPLIT_STAGES", None), ("SPLIT_WARPS", None), ("TWO_STAGE_ROWS", 16)):
        monkeypatch.setattr(kernel, name, value)
    block = kernel.BLOCK_S
    assert kernel._split_tuning(block, 16) == {}  # one key block: nothing to pipeline
    assert kernel._split_tuning(2 * block, 16) == kernel._split_tuning(4 * block, 16) == {"num_stages": 2}
    assert kernel._split_tuning(4 * block, 32) == kernel._split_tuning(4 * block, 64) == {}
    monkeypatch.setattr(kernel, "SPLIT_STAGES", 3)
    assert kernel._split_tuning(4 * block, 16) == {"num_stages": 3}


def test_the_hand_gemm_source_is_found():
    """kernels/cubin builds csrc/ on first use: a wrong path would silently fall back to cuBLAS on the GPU."""
    from dflash_cli.kernels import cubin

    assert cubin.source("skinny_gemm.cu") is not None, cubin.CSRC


def test_dflash2_kernels_take_one_block_of_one_dtype():
    """DFlash 2's kernels run on CUDA only, on a block's rows of one dtype with unit-stride channels (a view of the
    projection for delta); the rest goes to models/dflash2.py's torch code. The sampled walk reads a float32
    temperature tensor."""
    pytest.importorskip("triton")
    from dflash_cli.kernels import dflash2 as k

    assert ops.model_kernels(torch.zeros(2), "dflash2") is None  # CPU: the torch code
    x, base = torch.zeros(8, 32), torch.zeros(2, 32)
    delta = torch.zeros(8, 2 * 2 * 4).view(8, 2, 2, 4)[:, 1]
    assert k.conv_fits(x, delta, base) and k.conv_fits(x, delta, base, x)
    assert not k.conv_fits(torch.zeros(33, 32), torch.zeros(33, 2, 4), base)  # more rows than a block
    assert not k.conv_fits(x.bfloat16(), delta, base)  # mixed dtypes
    assert not k.conv_fits(torch.zeros(32, 8).t(), delta, base)  # strided channels
    assert not k.conv_fits(x, delta, base, torch.zeros(8, 32, dtype=torch.float64))
    candidates, scores = torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4, 4)
    assert k.walk_fits(candidates, scores) and k.walk_fits(candidates, scores, torch.ones(1))
    assert not k.walk_fits(candidates, scores, torch.ones(1, dtype=torch.float64))


def test_every_kernel_module_gets_the_steps_carveout():
    """A step's kernels share one L1 / shared split (kernels/carveout.py); a module of Triton kernels left out of
    STEP_MODULES runs at the driver's split (the sampler's kernels were, until 2026-12-05). pdl and block_trace hold
    only device functions that other kernels inline."""
    from pathlib import Path

    from dflash_cli.kernels import carveout

    folder = Path(carveout.__file__).parent
    with_kernels = {p.stem for p in folder.glob("*.py") if "@triton.jit" in p.read_text()} - {"pdl", "block_trace"}
    assert with_kernels == set(carveout.STEP_MODULES)
