"""The fused Triton kernels in bf16 on the GPU against the torch reference (run on CPU), at Qwen3-4B shapes."""

import pytest
import torch

from dflash_cli.layers import ops
from dflash_cli.runtime.graphs import padded_prefill

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def rel(a, b):
    return ((a.float().cpu() - b.float()).abs().max() / b.float().abs().max()).item()


def test_fused_kernels_match_reference_bf16():
    from dflash_cli.kernels import elementwise as k

    torch.manual_seed(0)
    bf = torch.bfloat16
    for t in (1, 16):
        x = torch.randn(t, 2560, dtype=bf)
        w = (1 + 0.1 * torch.randn(2560)).to(bf)
        assert rel(k.rms_norm(x.cuda(), w.cuda(), 1e-6), ops.rms_norm(x, w, 1e-6)) <= 1e-2
        qkv = torch.randn(t, 48 * 128, dtype=bf)
        q = qkv[:, : 32 * 128].reshape(t, 32, 128)
        wq = (1 + 0.1 * torch.randn(128)).to(bf)
        assert rel(k.rms_norm(q.cuda(), wq.cuda(), 1e-6), ops.rms_norm(q, wq, 1e-6)) <= 1e-2
        cos, sin = ops.rope_tables(128, 1e6, 4096, "cpu")
        c, s = cos[3000 : 3000 + t].contiguous(), sin[3000 : 3000 + t].contiguous()
        assert rel(k.apply_rope(q.cuda(), c.cuda(), s.cuda()), ops.apply_rope(q, c, s)) <= 1e-2
        kk = qkv[:, 32 * 128 : 40 * 128].reshape(t, 8, 128)
        wk = (1 + 0.1 * torch.randn(128)).to(bf)
        gq, gk = k.qk_norm_rope(q.cuda(), kk.cuda(), wq.cuda(), wk.cuda(), 1e-6, c.cuda(), s.cuda())
        assert rel(gq, ops.apply_rope(ops.rms_norm(q, wq, 1e-6), c, s)) <= 1e-2
        assert rel(gk, ops.apply_rope(ops.rms_norm(kk, wk, 1e-6), c, s)) <= 1e-2
        v = qkv[:, 40 * 128 :].reshape(t, 8, 128)
        kc, vc = torch.zeros(4096, 8, 128, dtype=bf, device="cuda"), torch.zeros(4096, 8, 128, dtype=bf, device="cuda")
        pos = torch.arange(3000, 3000 + t, device="cuda")
        gq2 = k.qk_norm_rope_write(q.cuda(), kk.cuda(), v.cuda(), wq.cuda(), wk.cuda(), 1e-6, cos.cuda(),
                                   sin.cuda(), kc, vc, pos)  # whole tables, read at pos
        assert rel(gq2, ops.apply_rope(ops.rms_norm(q, wq, 1e-6), c, s)) <= 1e-2
        assert rel(kc[3000 : 3000 + t], ops.apply_rope(ops.rms_norm(kk, wk, 1e-6), c, s)) <= 1e-2
        assert torch.equal(vc[3000 : 3000 + t].cpu(), v) and kc[:3000].abs().sum() == 0
        # The DFlash drafter's context rows: 5 layers' keys and values from one [T, 5, 2, 8, 128] projection.
        kvl = torch.randn(t, 5, 2, 8, 128, dtype=bf)
        wl = (1 + 0.1 * torch.randn(5, 128)).to(bf)
        kcl, vcl = (torch.zeros(5, 4096, 8, 128, dtype=bf, device="cuda") for _ in range(2))
        kl = kvl.cuda()
        k.k_norm_rope_write_layers(kl[:, :, 0], kl[:, :, 1], wl.cuda(), 1e-6, cos.cuda(), sin.cuda(), kcl, vcl, pos)
        for i in range(5):
            ref = ops.apply_rope(ops.rms_norm(kvl[:, i, 0], wl[i], 1e-6), c, s)
            assert rel(kcl[i, 3000 : 3000 + t], ref) <= 1e-2
            assert torch.equal(vcl[i, 3000 : 3000 + t].cpu(), kvl[:, i, 1])
        assert kcl[:, :3000].abs().sum() == 0
        delta = torch.randn(t, 2560, dtype=bf)
        h2, x2 = k.add_rms_norm(x.cuda(), delta.cuda(), w.cuda(), 1e-6)
        assert rel(h2, x + delta) <= 1e-2 and rel(x2, ops.rms_norm(x + delta, w, 1e-6)) <= 1e-2
        gu = torch.randn(t, 2 * 9728, dtype=bf)
        assert rel(k.silu_mul(gu.cuda()), ops.silu_mul(gu)) <= 1e-2


@pytest.mark.parametrize("t,window,last,causal", [
    (1, 1024, 724, True), (1, 16384, 8300, True), (1, 2048, 1100, True), (16, 1024, 739, True),
    (16, 2048, 1100, True), (16, 2048, 1100, False), (16, 8192, 7907, False)])
def test_window_attention_matches_reference_bf16(t, window, last, causal):
    from dflash_cli.kernels.attention import attention_window

    torch.manual_seed(1)
    bf = torch.bfloat16
    q = torch.randn(t, 32, 128, dtype=bf)
    k, v = torch.randn(window, 8, 128, dtype=bf), torch.randn(window, 8, 128, dtype=bf)
    pos = torch.arange(last + 1 - t, last + 1)
    limit = pos if causal else pos[-1:].expand(t).contiguous()
    ref = ops.attention_masked(q.float(), k.float(), v.float(), torch.arange(window)[None, :] <= limit[:, None],
                               128**-0.5)
    got = attention_window(q.cuda(), k.cuda(), v.cuda(), limit.cuda(), 128**-0.5)
    assert rel(got, ref) <= 2e-2


@pytest.mark.parametrize("t,window,start,pad", [(2048, 2048, 0, 0), (512, 2048, 1000, 212), (64, 256, 100, 30),
                                               (256, 8192, 7000, 0)])
def test_prefill_attention_matches_reference_bf16(t, window, start, pad):
    """A padded prefill's rows (the padding first, at positions after the prompt's) at Qwen3-4B head shapes."""
    from dflash_cli.kernels.prefill_attention import attention_window

    torch.manual_seed(3)
    bf = torch.bfloat16
    q = torch.randn(t, 32, 128, dtype=bf)
    k, v = torch.randn(window, 8, 128, dtype=bf), torch.randn(window, 8, 128, dtype=bf)
    limit = torch.tensor(padded_prefill(range(t - pad), start, t)[1])  # padding rows first, after the prompt
    ref = ops.attention_masked(q.float(), k.float(), v.float(), torch.arange(window)[None, :] <= limit[:, None],
                               128**-0.5)
    got = attention_window(q.cuda(), k.cuda(), v.cuda(), limit.cuda(), 128**-0.5)
    assert rel(got, ref) <= 2e-2


@pytest.mark.parametrize("t,window,pos0,causal", [
    (1, 2048, 1023, True), (1, 16384, 8299, True), (4, 2048, 1022, True), (2, 2048, 250, False),
    (8, 2048, 1000, True), (16, 2048, 1000, True), (16, 16384, 8200, False)])
@pytest.mark.parametrize("block", [16, 32])
def test_fresh_attention_matches_unfused_bf16(t, window, pos0, causal, block, monkeypatch):
    """The split kernel's own q/k norm, RoPE and cache write (a step's rows, in row blocks of 16 or 32) against
    the RoPE kernel then attention_window, and both against the fp32 reference."""
    from dflash_cli.kernels import attention
    from dflash_cli.kernels import elementwise as k

    monkeypatch.setattr(attention, "FRESH_BLOCK", block)
    torch.manual_seed(2)
    bf, dev = torch.bfloat16, "cuda"
    qkv = torch.randn(t, 48 * 128, dtype=bf, device=dev)
    q, kk, v = (a.reshape(t, -1, 128) for a in qkv.split([32 * 128, 8 * 128, 8 * 128], -1))
    wq, wk = ((1 + 0.1 * torch.randn(128)).to(bf).to(dev) for _ in range(2))
    cos, sin = (a.to(dev) for a in ops.rope_tables(128, 1e6, window + 64, "cpu"))
    kc, vc = torch.randn(window + 64, 8, 128, dtype=bf, device=dev), torch.randn(window + 64, 8, 128, dtype=bf, device=dev)
    kc2, vc2 = kc.clone(), vc.clone()
    pos = torch.arange(pos0, pos0 + t, device=dev)
    limit = pos if causal else pos[-1:].expand(t)
    got = attention.attention_fresh(q, kk, v, wq, wk, 1e-6, cos, sin, kc, vc, pos, window, limit, 128**-0.5)
    q2 = k.qk_norm_rope_write(q, kk, v, wq, wk, 1e-6, cos, sin, kc2, vc2, pos)
    unfused = attention.attention_window(q2, kc2[:window], vc2[:window], limit, 128**-0.5)
    assert torch.equal(vc, vc2) and rel(kc, kc2.cpu()) <= 1e-2 and rel(got, unfused.cpu()) <= 1e-2
    ref = ops.attention_masked(q2.float().cpu(), kc2[:window].float().cpu(), vc2[:window].float().cpu(),
                               torch.arange(window)[None, :] <= limit.cpu()[:, None], 128**-0.5)
    assert rel(got, ref) <= 2e-2
    # A decode row's split asking L2 for another tensor's bytes (ops.split_warm) is a hint: the same bits.
    other = torch.empty((8 << 20) + 4112, dtype=torch.uint8, device=dev)
    warmed = attention.attention_fresh(q, kk, v, wq, wk, 1e-6, cos, sin, kc, vc, pos, window, limit, 128**-0.5,
                                       warm=(other, other.numel()))
    assert torch.equal(warmed, got)


@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_skinny_gemms_match_reference_bf16(m):
    """Both skinny GEMMs (Triton; CUDA from csrc/ where nvcc is present) at Qwen3-4B / drafter shapes."""
    from dflash_cli.kernels import cuda_gemm
    from dflash_cli.kernels.skinny_gemm import config_for, skinny_linear

    torch.manual_seed(2)
    bf = torch.bfloat16
    dev = torch.device("cuda")
    built = cuda_gemm.available(dev)
    for n, k in ((6144, 2560), (2560, 4096), (2560, 9728), (151936, 2560), (2560, 12800)):
        x = torch.randn(m, k, dtype=bf, device=dev)
        w = torch.randn(n, k, dtype=bf, device=dev) * 0.02
        ref = x.float() @ w.float().T
        err = lambda y: ((y.float() - ref).norm() / ref.norm()).item()  # noqa: E731
        assert err(skinny_linear(x, w)) <= 1e-2
        if config_for(n, k)[2] == 1:  # one K split (the vocabulary head): no atomics, so bit-equal
            assert torch.equal(skinny_linear(x, w, out_dtype=torch.float32), skinny_linear(x, w).float())
        if built:
            y = cuda_gemm.skinny_linear(x, w)
            assert err(y) <= 1e-2
            assert torch.equal(y, cuda_gemm.skinny_linear(x, w))  # split-K partials add in a fixed order
            # Warming another weight into L2 is a hint: the same bits, whatever the ranges (odd-sized, two).
            other = torch.randn(4099, 1024, dtype=bf, device=dev)
            warm = ((other.data_ptr(), 1 << 20), (other[2048:].data_ptr(), (other[2048:].numel() * 2) & ~15))
            assert torch.equal(y, cuda_gemm.skinny_linear(x, w, warm=warm))
            if cuda_gemm.fits(n, (4, 1, 4, "tile16")):
                t16 = cuda_gemm.skinny_linear(x, w, (4, 1, 4, "tile16"))
                assert torch.equal(t16, cuda_gemm.skinny_linear(x, w, (4, 1, 4, "tile16"), warm=warm[:1]))
            for cfg in ((1, 1, 2), (8, 4, 4), (2, 8, 8), (4, 1, 8, "tile16"), (2, 2, 4, "tile16"),
                        (8, 4, 2, "tile16")):
                if cuda_gemm.fits(n, cfg):
                    assert err(cuda_gemm.skinny_linear(x, w, cfg)) <= 1e-2
                    assert err(cuda_gemm.skinny_linear(x, w, cfg)) <= 1e-2  # the arrival counters were reset
    if not built:
        pytest.skip(cuda_gemm.unavailable_reason(dev))


@pytest.mark.parametrize("m", [1, 3, 9, 16])
def test_swiglu_epilogue_matches_unfused_bf16(m):
    """The CUDA GEMM's SwiGLU epilogue against the GEMM then the activation kernel (same bf16 roundings)."""
    from dflash_cli.layers import ops
    from dflash_cli.kernels import cuda_gemm
    from dflash_cli.kernels.elementwise import silu_mul

    dev = torch.device("cuda")
    if not cuda_gemm.available(dev):
        pytest.skip(cuda_gemm.unavailable_reason(dev))
    torch.manual_seed(3)
    for n, k in ((19456, 2560), (3072 * 2, 1024), (64, 256)):
        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.05
        for cfg in (None, (1, 1, 2), (4, 2, 4), (8, 4, 8), (2, 1, 8, "tile16"), (4, 2, 4, "tile16")):
            if cfg and (not cuda_gemm.fits(n, cfg) or k // 32 < cfg[0] * cfg[1]):
                continue
            unfused = silu_mul(cuda_gemm.skinny_linear(x, w, cfg))
            fused = cuda_gemm.skinny_linear(x, w, cfg, swiglu=True)
            assert fused.shape == (m, n // 2)
            # Same GEMM sums and roundings; only exp may differ in its last bits from Triton's.
            assert ((fused.float() - unfused.float()).abs() > 1e-2 * unfused.float().abs() + 1e-3).sum() == 0
        ref = ops.silu_mul(x.float() @ w.float().T)
        assert ((ops.swiglu(x, w).float() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.parametrize("m", [1, 3, 9, 16])
def test_norm_and_residual_fusions_match_unfused_bf16(m):
    """The CUDA GEMM with a unit-weight RMSNorm folded in (x is the residual stream) and with the residual add in
    its epilogue, against the unfused kernels and the fp32 reference, over tile kinds, warps and K splits."""
    from dflash_cli.kernels import cuda_gemm

    dev = torch.device("cuda")
    if not cuda_gemm.available(dev):
        pytest.skip(cuda_gemm.unavailable_reason(dev))
    torch.manual_seed(4)
    bf, eps = torch.bfloat16, 1e-6
    err = lambda y, ref: ((y.float() - ref).norm() / ref.norm()).item()  # noqa: E731
    for n, k, swiglu in ((6144, 2560, False), (19456, 2560, True), (2560, 4096, False), (64, 256, True)):
        h = torch.randn(m, k, dtype=bf, device=dev) * 3
        w = torch.randn(n, k, dtype=bf, device=dev) * 0.05
        ref = ops.unit_rms_norm(h.float(), eps) @ w.float().T
        ref = ops.silu_mul(ref) if swiglu else ref
        unfused_x = ops.unit_rms_norm(h, eps)
        for cfg in (None, (1, 1, 2), (4, 2, 4), (8, 4, 8), (2, 1, 8, "tile16"), (4, 2, 4, "tile16")):
            if cfg and (not cuda_gemm.fits(n, cfg) or k // 32 < cfg[0] * cfg[1]):
                continue
            fused = cuda_gemm.skinny_linear(h, w, cfg, swiglu=swiglu, norm=eps)
            assert fused.shape == (m, n // 2 if swiglu else n)
            assert err(fused, ref) <= 1e-2, cfg
            unfused = cuda_gemm.skinny_linear(unfused_x, w, cfg, swiglu=swiglu)
            assert err(fused, unfused.float()) <= 1e-2, cfg
            assert torch.equal(fused, cuda_gemm.skinny_linear(h, w, cfg, swiglu=swiglu, norm=eps))
            if not swiglu:
                # The residual add rounds as the unfused product then add: bit-equal.
                r = torch.randn(m, n, dtype=bf, device=dev)
                assert torch.equal(cuda_gemm.skinny_linear(h, w, cfg, residual=r), r + cuda_gemm.skinny_linear(h, w, cfg))
        via_ops = ops.swiglu(h, w, norm=eps) if swiglu else ops.linear(h, w, norm=eps)
        if m <= 8 and cuda_gemm.takes_squares(m, k, n):
            # The product that writes h (an [k, n] weight, residual add inside) leaves h's partial squares, and at
            # one row the product after it takes its norm from them: the same up to the sum's order.
            a, wa, r = torch.randn(m, n, dtype=bf, device=dev), torch.randn(k, n, dtype=bf, device=dev) * 0.05, h
            for cfg in (None, (1, 1, 2), (4, 2, 4), (8, 4, 8)):  # one warp, K splits, unrolls
                if cfg and (not cuda_gemm.fits(k, cfg) or n // 32 < cfg[0] * cfg[1]):
                    continue
                sq = torch.full((m, k // 8), float("nan"), device=dev)
                out = cuda_gemm.skinny_linear(a, wa, cfg, residual=r, squares_out=sq)
                assert torch.equal(out, r + cuda_gemm.skinny_linear(a, wa, cfg)), cfg
                assert torch.allclose(sq, out.float().view(m, k // 8, 8).pow(2).sum(-1), rtol=1e-5, atol=1e-6), cfg
            if m == 1:
                out, sq = ops.linear_squares(a, wa, r)
                assert ops.fuses_squares(a) and sq is not None and torch.equal(out, ops.linear(a, wa, residual=r))
                assert torch.allclose(sq, out.float().view(m, k // 8, 8).pow(2).sum(-1), rtol=1e-5, atol=1e-6)
                scaled = cuda_gemm.skinny_linear(out, w, swiglu=swiglu, norm=eps, squares=sq)
                normed = cuda_gemm.skinny_linear(out, w, swiglu=swiglu, norm=eps)
                assert ((scaled.float() - normed.float()).abs() > 1e-2 * normed.float().abs() + 1e-3).sum() == 0

                def via(s):
                    return ops.swiglu(out, w, norm=eps, squares=s) if swiglu else ops.linear(out, w, norm=eps, squares=s)

                assert torch.equal(scaled, via(sq)) and not torch.equal(via(sq * 4), scaled)  # the squares are read
                for cfg in ((1, 1, 2), (4, 2, 4), (8, 4, 8)):  # against NORM under the same plan (same sums)
                    if cuda_gemm.fits(n, cfg) and k // 32 >= cfg[0] * cfg[1]:
                        got = cuda_gemm.skinny_linear(out, w, cfg, swiglu=swiglu, norm=eps, squares=sq).float()
                        want = cuda_gemm.skinny_linear(out, w, cfg, swiglu=swiglu, norm=eps).float()
                        assert ((got - want).abs() > 1e-2 * want.abs() + 1e-3).sum() == 0, cfg
        assert ops.fuses_norms(h, w) == (m >= ops._QKV_NORM_MIN_ROWS) and ops.folds_norms(dev, bf)
        assert ops.fuses_mlp_norm(h) == (m >= ops._NORMS_FUSED_MIN_ROWS)
        assert err(via_ops, ref) <= 1e-2


def test_greedy_kernels_match_torch():
    """Argmax rows and the greedy verdict at the vocabulary's size, ties included."""
    from dflash_cli.kernels import greedy

    torch.manual_seed(0)
    for rows in (1, 15, 17):
        lg = torch.randn(rows, 151936, device="cuda")
        lg[0, 5] = lg[0, 150000] = lg[0].max() + 1  # a tie across chunks: the first index wins
        best = lg.argmax(-1)
        assert torch.equal(greedy.argmax_rows(lg), best)
        for cut in range(rows):  # the first `cut` drafts agree
            drafts = best[:-1].clone()
            drafts[cut:] += 1
            ids = torch.cat([best.new_tensor([3]), drafts])
            got = greedy.greedy_verdict(ids, lg).cpu()
            assert got[0] == min(cut, rows - 1) and got[1] == best[got[0]].cpu() and torch.equal(got[2:], drafts.cpu())
    # One row fed on to the next step: its token as the next input, the next position, the token's record.
    ids, positions, fed = best.new_tensor([3]), best.new_tensor([8]), best.new_zeros(12)
    got = greedy.greedy_verdict(ids, lg[:1], (positions, fed)).cpu()
    b = int(best[0])
    assert got.tolist() == [0, b] and ids.tolist() == [b] and positions.tolist() == [9]
    assert fed.tolist() == [0] * 9 + [b] + [0] * 2


def test_sampling_top_k_matches_torch():
    """kernels/sampling's exact top-k (the chunks' floor, the merges) at the vocabularies' sizes: torch's values,
    ids as a stable descending sort's (ties to the lower index); rows that send chunks down the whole-chunk path
    (all tied, ascending), a tie across chunks, -inf; and its filtered rows against the torch code's."""
    from dflash_cli.kernels import sampling as k
    from dflash_cli.runtime import sampling
    from dflash_cli.runtime.sampling import SamplingParams, TOP_K

    torch.manual_seed(0)
    s = sampling.Sampler(torch.device("cuda"))
    s.load(SamplingParams(0.6, 0.95, 20))
    for rows, vocab, top in ((1, 151936, 64), (16, 151936, 64), (7, 151936, 16), (16, 248320, 64), (3, 32000, 64),
                             (5, 248320, 5)):
        lg = torch.randn(rows, vocab, device="cuda") * 4
        lg[0, 7] = lg[0, vocab - 3000] = lg[0].max() + 1  # a tie across chunks: the lower index first
        if rows > 2:
            lg[1] = 0.5
            lg[2] = torch.arange(vocab, device="cuda") / vocab
            lg[2, ::3] = float("-inf")
        values, ids = k.top_k(lg, top)
        want = torch.sort(lg, dim=-1, descending=True, stable=True)
        assert torch.equal(values, want.values[:, :top]) and torch.equal(ids, want.indices[:, :top]), (rows, vocab)
        if top == 64:  # on rows without ties (which of a tie top-k / top-p keeps is torch's choice)
            lg = torch.randn(rows, vocab, device="cuda") * 4
            got = sampling._rows(rows, lg.device)
            k.filtered(lg, 64, s.temperature, s.top_p, s.top_k, got.ids, got.probs)
            with ops.reference_only():
                ref = sampling.filtered(lg, TOP_K, s)
            assert torch.allclose(got.dense(vocab), ref.dense(vocab), atol=1e-6), (rows, vocab)


def test_sampled_verdict_matches_torch():
    """The block-verification verdict compiled (kernels/sampling.accept) against the torch code on the same noise:
    every count of accepted drafts, each the same count and next token (tests/verdict_check.py): equal but for
    rounding (the compiled code divides and exponentiates approximately), a flip needing a uniform within ulps of h."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from verdict_check import check_verdicts

    check_verdicts("cuda", trials=70)


def test_dflash2_kernels_match_reference_bf16():
    """DFlash 2's convolution, selector scores and walk (kernels/dflash2.py) in bf16 at the Qwen3-4B drafter's shapes
    (H 2560, groups of 16, 2 taps, rank 256, K 16, 7 draft rows) against the torch code on CPU: the convolution to
    the reference's bf16 roundings, the walk's picks on the same scores and noise."""
    from dflash_cli.kernels import dflash2 as k
    from dflash_cli.models.dflash2 import CandidateSelector, convolve

    torch.manual_seed(0)
    bf = torch.bfloat16
    for rows, taps in ((8, 2), (16, 4), (1, 3)):
        x, h, base = torch.randn(rows, 2560).to(bf), torch.randn(rows, 2560).to(bf), torch.randn(taps, 2560).to(bf)
        delta = torch.randn(rows, 2 * taps * 160).to(bf).view(rows, 2, taps, 160)[:, 0]
        want = convolve(x, delta, base, h)
        got = k.dynamic_conv(x.cuda(), delta.cuda(), base.cuda(), h.cuda()).cpu()
        assert (got != want).float().mean() <= 1e-3 and rel(got, want) <= 1e-2  # the reference's roundings
        weight = (1 + 0.1 * torch.randn(2560)).to(bf)
        got_h, got_x = k.conv_add_rms_norm(x.cuda(), delta.cuda(), base.cuda(), h.cuda(), weight.cuda(), 1e-6)
        assert torch.equal(got_h.cpu(), got) and rel(got_x, ops.rms_norm(want, weight, 1e-6)) <= 1e-2
        assert torch.equal(got_x, ops.rms_norm(got_h, weight.cuda(), 1e-6))  # the unfused path's norm, exactly
    sel = CandidateSelector(torch.randn(151936, 256).to(bf) * 0.1, torch.randn(151936, 256).to(bf) * 0.1,
                            torch.randn(256, 2560).to(bf) * 0.02, 16)
    x, logits = torch.randn(7, 2560).to(bf), torch.randn(7, 151936) * 3
    anchor = torch.tensor([1234])
    candidates, scores = sel.scores(x, logits, anchor)
    cuda = CandidateSelector(*(t.cuda() for t in (sel.predecessor, sel.successor, sel.projection)), 16)
    got_c, got_s = cuda.scores(x.cuda(), logits.cuda(), anchor.cuda())
    assert torch.equal(got_c.cpu(), candidates) and rel(got_s, scores) <= 1e-2
    got_s = got_s.cpu()
    tokens, _ = CandidateSelector.walk(candidates, got_s)
    assert torch.equal(k.selector_walk(got_c, got_s.cuda())[0].cpu(), tokens)
    noise = torch.empty(7, 16).exponential_()
    rows = iter(noise.split(1))
    tokens, q = CandidateSelector.walk(candidates, got_s, torch.tensor([0.8]), lambda w: (w / next(rows)).argmax(-1))
    got_t, got_q = k.selector_walk(got_c, got_s.cuda(), torch.tensor([0.8], device="cuda"), noise.cuda())
    assert torch.equal(got_t.cpu(), tokens) and torch.allclose(got_q.cpu(), q, rtol=1e-5, atol=1e-7)
