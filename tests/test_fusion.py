"""The fusion plan (layers/fusion.py): where a forward's norms and residual adds run, by rows and weights; and the
residual stream it carries computes what the plain pre-norm block computes."""

import torch

from dflash_cli.layers import fusion, ops


def test_plan_by_rows_where_the_products_take_the_norms(monkeypatch):
    h1, h4, h16 = torch.zeros(1, 8), torch.zeros(4, 8), torch.zeros(16, 8)
    qkv = torch.zeros(24, 8)
    assert fusion.plan(h16, qkv, norms_folded=True, eps=1e-6) == fusion.Fusion(False, "add", "add", 1e-6)  # CPU
    monkeypatch.setattr(ops, "fuses_norms", lambda h, w: True)
    assert fusion.plan(h16, qkv, norms_folded=False, eps=1e-6).norm_in_product is False
    one, few, many = (fusion.plan(h, qkv, norms_folded=True, eps=1e-6) for h in (h1, h4, h16))
    assert (one.norm_in_product, one.attention_out, one.mlp_out) == (True, "squares", "squares")
    assert (few.norm_in_product, few.attention_out, few.mlp_out) == (True, "add", "residual")
    assert (many.norm_in_product, many.attention_out, many.mlp_out) == (True, "residual", "residual")


def test_every_plan_computes_the_pre_norm_residual_updates():
    """h + x W^T then RMSNorm(h) by w, under each way of carrying the stream (off the GPU the products' norm and
    residual are the composition, so all agree with the plain formula)."""
    torch.manual_seed(0)
    h, x, w, norm = torch.randn(3, 16), torch.randn(3, 8), torch.randn(16, 8), torch.rand(16) + 0.5
    want_h = h + x @ w.T
    want_x = ops.rms_norm(want_h, norm, 1e-6)
    for how in ("add", "residual", "squares"):
        f = fusion.Fusion(how != "add", how, how, 1e-6)
        s = f.add(fusion.Residual(h), x, w, how)
        got, kw = f.read(s, norm if how == "add" else torch.ones(16))
        if kw:  # the product normalises its input itself: what it reads is the unit-weight norm of h
            got = ops.unit_rms_norm(got, kw["norm"]) * norm
        torch.testing.assert_close(s.settle(), want_h)
        torch.testing.assert_close(got, want_x)
    f = fusion.Fusion(False, "add", "add", 1e-6)
    s = f.add(fusion.Residual(h), x, w, "add")
    torch.testing.assert_close(f.final(s, norm), want_x)
    assert s.delta is None
    torch.testing.assert_close(s.h, want_h)
