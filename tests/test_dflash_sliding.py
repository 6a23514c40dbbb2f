"""DFlash drafters with sliding-window layers (z-lab's Qwen3.5 drafters: 5 sliding layers + 1 full), against z-lab's
reference (`dflash` 0.1.0) with windows smaller than the context, on the eager and the static path; their config
handling; and the DFLASH_DRAFT_WINDOW knob that gives a Qwen3 drafter a window."""

import json

import pytest
import torch

from dflash_cli import tuning
from dflash_cli.errors import DflashError
from dflash_cli.layers import ops
from dflash_cli.loading.config import Qwen3Config
from dflash_cli.models.dflash import SLIDING_SEMANTICS, DFlashConfig, DFlashDrafter, LayerAttention
from dflash_cli.models.qwen3 import Qwen3Model
from dflash_cli.runtime.drafters import load
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from test_dflash_parity import assert_matches_reference, run_reference
from tiny import make_dflash, make_qwen3

transformers = pytest.importorskip("transformers")
zlab = pytest.importorskip("dflash.model")

SLIDING = ["sliding_attention", "sliding_attention", "full_attention"]


def sliding_fields(window: int, types=SLIDING) -> dict:
    return dict(layer_types=list(types), sliding_window=window, use_sliding_window=True, max_window_layers=len(types))


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("swa-target")
    d = make_qwen3(root / "target", seed=5, num_hidden_layers=5, with_tokenizer=False)
    return d, json.loads((d / "config.json").read_text()), Qwen3Model.load(d)


@pytest.fixture(scope="module")
def ref_target(target):
    return transformers.Qwen3ForCausalLM.from_pretrained(target[0], dtype=torch.float32).eval()


def run_ours(drafter, target_model, prompt, max_new, path):
    """path "queued": the static path with each step's proposal queued before the verdict is read (drafts from the
    device-staged block, no draft_logits call to record); "static": the same forward, proposals after the read."""
    logits = []
    proposer = DFlashProposer(drafter)
    orig = proposer.draft_logits
    proposer.draft_logits = lambda last, k: logits.append(orig(last, k)) or logits[-1]
    session = Session(target_model, max_len=prompt.shape[0] + max_new, path="eager" if path == "eager" else "static")
    decoder = SpeculativeDecoder(proposer)
    decoder.queue_ahead = path == "queued"
    res = generate(session, decoder, Request(prompt.tolist(), SamplingParams(), max_tokens=max_new))
    return res, logits


# block 4 / window 6: the window is longer than the block; block 8 / window 5: shorter, so it cuts into the block too.
@pytest.mark.parametrize("block,window", [(4, 6), (8, 5)])
@pytest.mark.parametrize("path", ["eager", "static", "queued"])
def test_sliding_drafter_matches_reference(target, ref_target, tmp_path, monkeypatch, block, window, path):
    target_dir, cfg, ours_t = target
    draft_dir = make_dflash(tmp_path / "draft", cfg, seed=6, layers=3, block_size=block, target_layer_ids=[1, 3],
                            **sliding_fields(window))
    ours_d = DFlashDrafter.load(draft_dir, ours_t)
    assert [a.window for a in ours_d.c.attention] == [window, window, None]
    assert [a.causal for a in ours_d.c.attention] == [True, True, False]
    ref_d = zlab.DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32).eval()
    assert [layer.self_attn.is_causal for layer in ref_d.layers] == [True, True, False]
    g = torch.Generator().manual_seed(block)
    prompt = torch.randint(0, 300, (20,), generator=g)  # the context passes the window from the first block
    max_new = 40
    ref, ref_logits = run_reference(ref_d, ref_target, prompt, max_new, monkeypatch)
    res, our_logits = run_ours(ours_d, ours_t, prompt, max_new, path)
    if path == "queued":  # no draft_logits calls to compare
        our_logits = ref_logits
    assert_matches_reference(res, ref, prompt.shape[0], our_logits, ref_logits, block)


def test_the_window_and_the_causal_block_change_the_drafts(target, tmp_path):
    """A window shorter than the context and the causal block each change the draft logits (else the parity above
    would not show that we apply them)."""
    _, cfg, ours_t = target
    prompt = torch.randint(0, 300, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    variants = {"swa": sliding_fields(5), "wide": sliding_fields(4096),
                "full": dict(layer_types=["full_attention"] * 3)}
    logits = {}
    for name, fields in variants.items():
        d = DFlashDrafter.load(make_dflash(tmp_path / name, cfg, seed=6, layers=3, block_size=4,
                                           target_layer_ids=[1, 3], **fields), ours_t)
        session = Session(ours_t, 64)
        out = session.forward(prompt, capture=d.capture)
        proposer = DFlashProposer(d)
        proposer.reset(64)
        proposer.absorb(out.hidden, 0)
        logits[name] = proposer.draft_logits(prompt[-1], 3)
    assert not torch.allclose(logits["swa"], logits["wide"], atol=1e-4)  # the window
    assert not torch.allclose(logits["wide"], logits["full"], atol=1e-4)  # the causal block


@pytest.mark.parametrize("path", ["eager", "static"])
def test_sliding_drafter_is_lossless(target, tmp_path, path):
    _, cfg, ours_t = target
    d = DFlashDrafter.load(make_dflash(tmp_path / "d", cfg, seed=8, layers=3, block_size=6, target_layer_ids=[0, 2],
                                       **sliding_fields(4)), ours_t)
    prompt = list(range(30, 52))
    plain = generate(Session(ours_t, 120, path=path), PlainDecoder(), Request(prompt, SamplingParams(), 60))
    spec = generate(Session(ours_t, 120, path=path), SpeculativeDecoder(DFlashProposer(d)),
                    Request(prompt, SamplingParams(), 60))
    assert spec.tokens == plain.tokens and len(spec.tokens) == 60


def test_qwen3_drafter_takes_a_window_from_the_knob(target, tmp_path, monkeypatch):
    """DFLASH_DRAFT_WINDOW gives every layer of a full-attention (Qwen3) drafter a window: non-causal, keys less
    than the window away, as the 0.1.0 reference computes a non-causal sliding layer; still lossless."""
    target_dir, cfg, ours_t = target
    draft_dir = make_dflash(tmp_path / "q3", cfg, seed=9, layers=2, block_size=4, target_layer_ids=[1, 3])
    monkeypatch.setattr(tuning, "KNOBS", tuning.read({"DFLASH_DRAFT_WINDOW": "6"}))
    proposer = load("dflash", draft_dir, ours_t)
    assert proposer.model.c.attention == (LayerAttention("full_attention", False, 6),) * 2
    # The same drafter as z-lab's reference computes it with every layer sliding and is_causal false.
    raw = json.loads((draft_dir / "config.json").read_text())
    raw.update(sliding_fields(6, ["sliding_attention"] * 2), is_causal=False)
    (draft_dir / "config.json").write_text(json.dumps(raw))
    ref_d = zlab.DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32).eval()
    ref_t = transformers.Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    prompt = torch.randint(0, 300, (18,), generator=torch.Generator().manual_seed(4))
    ref, ref_logits = run_reference(ref_d, ref_t, prompt, 30, monkeypatch)
    res, our_logits = run_ours(proposer.model, ours_t, prompt, 30, "static")
    assert_matches_reference(res, ref, prompt.shape[0], our_logits, ref_logits, 4)
    with pytest.raises(DflashError, match="DFLASH_DRAFT_WINDOW"):
        tuning.read({"DFLASH_DRAFT_WINDOW": "0"})
    monkeypatch.setattr(tuning, "KNOBS", tuning.read({}))
    assert load("dflash", draft_dir, ours_t).model.c.attention[0] == LayerAttention("sliding_attention", False, 6)


def test_config_names_its_attention_rule_and_refuses_unknown_layer_types(target, tmp_path):
    _, cfg, _ = target
    path = tmp_path / "config.json"
    base = json.loads((make_dflash(tmp_path / "c", cfg, layers=3) / "config.json").read_text())
    c = DFlashConfig(dict(base, **sliding_fields(4096)), path)
    assert c.attention_rule.startswith(SLIDING_SEMANTICS) and c.layer_masks == c.attention
    assert DFlashConfig(base, path).layer_masks is None  # a plain Qwen3 drafter: the spans' non-causal block alone
    forced = DFlashConfig(dict(base, **sliding_fields(64), is_causal=False), path)
    assert [a.causal for a in forced.attention] == [False] * 3 and "is_causal=False" in forced.attention_rule
    # use_sliding_window false: the layers keep their type (causal, as the reference makes them) but no window.
    off = DFlashConfig(dict(base, **dict(sliding_fields(64), use_sliding_window=False)), path)
    assert [(a.causal, a.window) for a in off.attention] == [(True, None), (True, None), (False, None)]
    # No layer_types: transformers' rule, the layers from max_window_layers on slide.
    derived = DFlashConfig(dict(base, sliding_window=32, use_sliding_window=True, max_window_layers=1), path)
    assert [a.window for a in derived.attention] == [None, 32, 32]
    for bad, match in ((dict(layer_types=["chunked_attention"] * 3), "unsupported drafter layer type"),
                       (dict(layer_types=["full_attention"] * 2), "one type for each"),
                       (dict(sliding_fields(0)), "sliding_window must be a positive")):
        with pytest.raises(DflashError, match=match):
            DFlashConfig(dict(base, **bad), path)
    with pytest.raises(DflashError, match="sliding-window attention is not supported"):  # targets: still refused
        Qwen3Config.from_dict(dict(cfg, sliding_window=64, use_sliding_window=True), path)


def test_window_masks_of_the_eager_and_static_forms_agree():
    """ops.attention's window (eager spans) and attention_window's lower limit (static spans) see the same keys."""
    torch.manual_seed(0)
    q, k, v = torch.randn(5, 4, 8), torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    pos = torch.arange(15, 20)
    for causal, w in ((True, 3), (False, 3), (True, 9), (False, None)):
        eager = ops.attention(q, k, v, q_offset=15, causal=causal, scale=0.3, window=w)
        limit = pos if causal else pos[-1:].expand(5)
        low = None
        if w is not None:
            low = pos - (w - 1)
            limit = limit if causal else torch.minimum(limit, pos + w - 1)
        torch.testing.assert_close(ops.attention_window(q, k, v, limit, 0.3, low), eager)
