"""Qwen3.5's layers through Qwen3's fusion plan (models/decoder.run_layers, layers/fusion.py): the (1 + w) input and
post norms folded into the mixer's input product and gate_up at load, the norms and residual adds inside the
products, on CPU where those products are their composition (float32)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from dflash_cli.layers import ops
from dflash_cli.models.mtp import MtpDrafter
from dflash_cli.models.qwen35 import GatedAttention, Qwen35Model
from dflash_cli.runtime.session import Session
from interpret import run_interpreted
from tiny import make_qwen35

CAPTURE = (1, 3, 4)  # after a DeltaNet layer, after the last DeltaNet before attention, after the attention layer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_qwen35(tmp_path_factory.mktemp("qwen35_fusion") / "t", seed=11, with_tokenizer=False)


def folded(checkpoint, monkeypatch) -> Qwen35Model:
    """The model as loaded where the GPU folds norm weights (ops.folds_norms)."""
    with monkeypatch.context() as m:
        m.setattr(ops, "folds_norms", lambda device, dtype: True)
        return Qwen35Model.load(checkpoint)


def run(model: Qwen35Model, path: str, prompt: list[int], steps: list[int]):
    """The prompt's logits and states, then one-row steps' (on `path`), as one list of (logits, hidden)."""
    session = Session(model, 64, path=path)
    out = [session.forward(prompt, all_logits=True, capture=CAPTURE)]
    out += [session.forward([t], capture=CAPTURE) for t in steps]
    return [(o.logits, o.hidden) for o in out]


@pytest.mark.parametrize("path", ["eager", "static"])
def test_folded_norm_weights_give_the_same_model(checkpoint, monkeypatch, path):
    """Folding each layer's (1 + w) norms into [qkv|z|b|a] or qkvg and gate_up leaves a prefill's and decode steps'
    logits and captured layer states as they were, up to rounding; every layer says so."""
    plain, fold = Qwen35Model.load(checkpoint), folded(checkpoint, monkeypatch)
    assert all(layer.norms_folded for layer in fold.layers) and not plain.layers[0].norms_folded
    attn = next(layer for layer in fold.layers if isinstance(layer.mixer, GatedAttention))
    assert attn.mixer_in is attn.mixer.qkvg and fold.layers[0].mixer_in is fold.layers[0].mixer.proj
    assert torch.equal(attn.input_norm, torch.ones(fold.cfg.hidden_size))
    prompt, steps = [5, 9, 77, 3, 120, 8, 41], [12, 200, 7]
    for (la, ha), (lb, hb) in zip(run(plain, path, prompt, steps), run(fold, path, prompt, steps)):
        torch.testing.assert_close(lb, la, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(hb, ha, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mlp_fused", [True, False])
def test_norms_inside_the_products_compute_the_kernel_path(checkpoint, monkeypatch, mlp_fused):
    """A folded hybrid with its norms and residual adds inside the products (what the GPU runs: all of them from 9
    rows, qkv / down's below, one row handing its squares on) computes what the add + norm kernels compute, bit for
    bit on the CPU; a one-row step hands the squares on from both of each layer's output products."""
    model = folded(checkpoint, monkeypatch)
    prompt, steps = [5, 9, 77, 3, 120], [12, 200]
    want = run(model, "static", prompt, steps)
    monkeypatch.setattr(ops, "fuses_norms", lambda h, w: True)
    monkeypatch.setattr(ops, "fuses_mlp_norm", lambda h: mlp_fused)
    calls = []
    real = ops.linear_squares
    monkeypatch.setattr(ops, "linear_squares", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    got = run(model, "static", prompt, steps)
    for (la, ha), (lb, hb) in zip(want, got):
        assert torch.equal(la, lb) and torch.equal(ha, hb)
    # The prompt's rows run no squares (fuses_squares: one row); each step's do, at the mixer's out and down.
    assert len(calls) == (0 if mlp_fused else 2 * len(model.layers) * len(steps))


@pytest.mark.parametrize("fused", [False, True])
def test_folded_mtp_drafts_as_the_unfolded_one(checkpoint, monkeypatch, fused):
    """The MTP layer runs through the same plan: folded at load where the target's layers are, it gives the unfolded
    layer's outputs up to rounding, with the norms in their own kernels or inside the products (`fused`)."""
    target = Qwen35Model.load(checkpoint)
    plain = MtpDrafter.load(checkpoint, target)
    with monkeypatch.context() as m:
        m.setattr(ops, "folds_norms", lambda device, dtype: True)
        fold = MtpDrafter.load(checkpoint, target)
    assert fold.layer.norms_folded and not plain.layer.norms_folded
    if fused:
        monkeypatch.setattr(ops, "fuses_norms", lambda h, w: True)
    from dflash_cli.layers.spans import StaticSpan

    state, ids = torch.randn(3, target.cfg.hidden_size), torch.tensor([4, 50, 9])
    outs = []
    for mtp in (plain, fold):
        cache, (cos, sin) = mtp.new_cache(16), mtp.rope_tables(16)
        rows = mtp.rows(StaticSpan(cache, torch.arange(2, 5), 16, cos, sin), state, ids)
        one = mtp.rows(StaticSpan(cache, torch.tensor([5]), 16, cos, sin), rows[-1:], ids[:1])
        outs.append((rows, one, mtp.logits(one)))
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


KERNELS = textwrap.dedent("""
    import sys
    import torch
    from dflash_cli.kernels import attention, elementwise
    from dflash_cli.layers import ops
    from dflash_cli.models.qwen35 import Qwen35Model
    # The hybrid with the Triton kernels dispatched as on CUDA (the interpreter runs them on float32 CPU tensors): an
    # eager prompt (q/k norm + partial RoPE kernel), then on device positions a 4-row span and a decode row (the split
    # kernel's own norm, partial RoPE and KV write: attention_fresh) and 20 rows (past the fresh kernel: the norm +
    # RoPE + write kernel, then the split kernel), against the torch reference.
    model = Qwen35Model.load(sys.argv[1])
    ids = torch.randint(0, model.cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    calls = {}
    for module, name in ((elementwise, "qk_norm_rope"), (elementwise, "qk_norm_rope_write"),
                         (attention, "attention_fresh"), (attention, "attention_window")):
        def counted(*a, _fn=getattr(module, name), _name=name, **kw):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*a, **kw)
        setattr(module, name, counted)
    reference, runs = ops.fast_kernels, []
    for kernels in (False, True):
        ops.fast_kernels = (lambda x: elementwise) if kernels else reference
        cache = model.new_cache(64)
        out = [model.forward(ids[:7], 0, cache, all_logits=True).logits]
        for a, b in ((7, 11), (11, 12), (12, 32)):
            out.append(model.forward_static(ids[a:b], torch.arange(a, b), cache, 48, all_logits=True).logits)
        runs.append((out, cache.kv.k.clone()))
    (want, want_k), (got, k) = runs
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel(g, w) <= 1e-5, (i, rel(g, w))
    assert rel(k, want_k) <= 1e-5
    # One attention layer: the prompt's norm + RoPE, two fresh forwards, the long one's write and window.
    assert calls == {"qk_norm_rope": 1, "attention_fresh": 2, "qk_norm_rope_write": 1, "attention_window": 1}, calls
    print("ok")
""")


def test_gated_attention_with_the_kernels_matches_the_reference(tmp_path):
    """The model's gated attention through the RoPE and attention kernels (a head of 64 dims, 16 of them rotated)
    gives the torch reference's logits and cached keys."""
    pytest.importorskip("triton")
    d = make_qwen35(tmp_path / "t", seed=12, with_tokenizer=False, extras=False, head_dim=64)
    run_interpreted(KERNELS, str(d), timeout=600)


def test_a_fused_decode_step_calls_one_op_per_kernel_it_launches(checkpoint, monkeypatch):
    """What a one-row decode step of the folded hybrid asks of the ops (layers/ops.py) where the GPU's products take
    its norms and adds (the calls the model, the fusion plan and the spans make; each one kernel on the GPU): per
    layer its mixer's input product (normalising the stream), the output product and down leaving squares, gate/up;
    per attention layer one fresh attention with its gate; then the final norm and the head. No norm, add, RoPE or
    gate of its own anywhere (the ~110 elementwise kernels, 81 norms and RoPE index / cat kernels of the unfused
    hybrid)."""
    from dflash_cli.layers import fusion, spans
    from dflash_cli.models import decoder, qwen35

    model = folded(checkpoint, monkeypatch)
    session = Session(model, 64, path="static")
    session.forward([5, 9, 77, 3, 120])
    monkeypatch.setattr(ops, "fuses_norms", lambda h, w: True)
    calls: dict[str, int] = {}

    class Counted:
        """ops as the model's modules see it: every call counted by name (the ops' own inner calls are not)."""

        def __getattr__(self, name):
            fn = getattr(ops, name)

            def call(*a, **kw):
                calls[name] = calls.get(name, 0) + 1
                if name == "attend_fresh":
                    assert kw["gate"] is not None  # the output gate inside the attention
                return fn(*a, **kw)
            return call if callable(fn) else fn

    for module in (qwen35, decoder, fusion, spans):
        monkeypatch.setattr(module, "ops", Counted())
    session.forward([12])
    layers, attention = len(model.layers), len(model.cfg.attention_layers)
    plan = {"fuses_norms": 1, "fuses_mlp_norm": 1, "fuses_squares": 1}  # the forward's fusion plan, once
    assert calls == {**plan, "linear": layers, "linear_squares": 2 * layers, "swiglu": layers,
                     "attend_fresh": attention, "rms_norm": 1, "logits": 1}, calls
