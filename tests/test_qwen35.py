"""Qwen3.5 hybrid targets against transformers' Qwen3_5ForCausalLM (torch fallbacks, float32, CPU): logits of a
prefill and of cached decode steps, `dflash generate`'s greedy ids, and loading the published layouts (multimodal
text tower under model.language_model., vision and MTP tensors ignored, sharded, tied or untied head, flat
qwen3_5_text configs)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file

from dflash_cli.errors import DflashError
from dflash_cli.layers.recurrent_state import HybridCache
from dflash_cli.loading.config import Qwen35Config, target_config
from dflash_cli.loading.weights import tensor_files
from dflash_cli.models.qwen35 import Qwen35Model
from dflash_cli.runtime.session import Session
from tiny import make_qwen35, save_sharded

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

STEPS = 20


def test_reference_uses_torch_fallbacks():
    """transformers would silently run `fla` / `causal_conv1d` kernels (which fail on CPU tensors) if importable."""
    assert importlib.util.find_spec("fla") is None
    assert importlib.util.find_spec("causal_conv1d") is None


def reference(model_dir) -> tuple[Qwen3_5ForCausalLM, Qwen3_5TextConfig]:
    """transformers' text model with the checkpoint's text tower (vision and MTP tensors dropped)."""
    text = json.loads((model_dir / "config.json").read_text())["text_config"]
    cfg = Qwen3_5TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    tensors = {}
    for name, path in tensor_files(model_dir).items():
        if name.startswith("model.language_model.") or name == "lm_head.weight":
            tensors[name.replace("model.language_model.", "model.")] = load_file(str(path))[name]
    model = Qwen3_5ForCausalLM(cfg).eval()
    model.load_state_dict(tensors, strict=not cfg.tie_word_embeddings)
    return model, cfg


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    d = make_qwen35(tmp_path_factory.mktemp("qwen35") / "t", seed=3, shards=2)
    return d, *reference(d)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def ref_greedy(model, cfg, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy continuation by transformers with its cache: the tokens and each forward's last logits."""
    cache = DynamicCache(config=cfg)
    x = torch.tensor([ids])
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(steps):
            out = model(x, cache=cache, use_cache=True).logits[0, -1]
            logits.append(out)
            tokens.append(int(out.argmax()))
            x = torch.tensor([[tokens[-1]]])
    return tokens, logits


@pytest.mark.parametrize("path,prompt_len", [("eager", 11), ("static", 11), ("eager", 150), ("static", 150)])
def test_logits_prefill_and_cached_decode(hybrid, path, prompt_len):
    """150 rows: a prefill in chunks (layers/delta_rule.py), then row-by-row decode steps from its state."""
    d, ref, cfg = hybrid
    ours = Qwen35Model.load(d)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        full = ref(torch.tensor([prompt])).logits[0]
    tokens, ref_logits = ref_greedy(ref, cfg, prompt, STEPS + 1)
    session = Session(ours, 192, path=path)
    out = session.forward(prompt, all_logits=True)
    assert rel(out.logits, full) < 1e-4
    for i in range(STEPS):
        logits = session.forward([tokens[i]]).logits[-1]
        assert rel(logits, ref_logits[i + 1]) < 1e-4, f"decode step {i}"
    assert session.length == len(prompt) + STEPS


def test_chunked_rule_equals_the_recurrence():
    """The chunked prefill form against transformers' row-by-row reference, strong and weak decays, from a state."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    from dflash_cli.layers.delta_rule import chunked

    g_ = torch.Generator().manual_seed(1)
    t, h, dk, dv = 150, 3, 16, 8
    q = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=g_), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=g_), dim=-1)
    v = torch.randn(t, h, dv, generator=g_)
    g = -torch.rand(t, h, generator=g_) * torch.tensor([0.01, 1.0, 20.0])  # per head: weak, medium, very strong
    beta = torch.rand(t, h, generator=g_)
    S0 = torch.randn(h, dk, dv, generator=g_)
    want_o, want_S = torch_recurrent_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                                      initial_state=S0[None], output_final_state=True)
    o, S = chunked(q * dk**-0.5, k, v, g, beta, S0)
    assert torch.allclose(o, want_o[0], atol=2e-5) and torch.allclose(S, want_S[0], atol=2e-5)


def test_generate_cli_matches_transformers_greedy(hybrid, cli):
    d, ref, cfg = hybrid
    r = cli("generate", "-m", d, "-p", "def fibonacci(n):", "--raw", "--temperature", "0", "--json", "-n", "16",
            "--draft", "none", "--device", "cpu")
    assert r.code == 0, r.err
    data = r.json()
    from dflash_cli.loading.tokenizer import ChatTokenizer

    prompt = ChatTokenizer(d).encode("def fibonacci(n):")
    assert data["prompt_tokens"] == len(prompt)
    want, _ = ref_greedy(ref, cfg, prompt, 16)
    stop = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    got = data["tokens"]
    cut = next((i + 1 for i, t in enumerate(want) if t in stop), len(want))
    assert got == want[:cut]


def test_chat_state_kept_across_turns(hybrid):
    """Two turns on one session (the second's prompt after the first's pending token) = one long greedy run. The first
    stops at a stop id, so its last step's look-ahead forward (already through the recurrent state) is dropped."""
    from dflash_cli.runtime.generation import PlainDecoder, Request, generate
    from dflash_cli.runtime.sampling import SamplingParams

    d, ref, cfg = hybrid
    a, b = [5, 9, 77, 3], [12, 40, 41]
    want1, _ = ref_greedy(ref, cfg, a, 12)
    cut = next(i for i in range(2, 12) if want1[i] not in want1[:i])
    want1 = want1[: cut + 1]
    want2, _ = ref_greedy(ref, cfg, a + want1 + b, 6)
    for path in ("eager", "static"):
        session = Session(Qwen35Model.load(d), 96, path=path)
        first = generate(session, PlainDecoder(queue_ahead=True), Request(a, SamplingParams(), 12, (want1[-1],)))
        second = generate(session, PlainDecoder(queue_ahead=True), Request(b, SamplingParams(), 6))
        assert first.finish_reason == "stop"
        assert first.tokens == want1 and second.tokens == want2


def test_loading_layouts(tmp_path):
    """Tied head (no lm_head), vision / MTP tensors ignored, a flat qwen3_5_text config as transformers' text-only save
    writes it; the cache is KV for the attention layers and a recurrent state for the others."""
    d = make_qwen35(tmp_path / "tied", seed=4, with_tokenizer=False, tie_word_embeddings=True, num_hidden_layers=8)
    cfg = target_config(d)
    assert isinstance(cfg, Qwen35Config) and cfg.tie_word_embeddings and cfg.rotary_dim == 8
    assert cfg.attention_layers == [3, 7] and len(cfg.linear_layers) == 6
    model = Qwen35Model.load(d)
    assert model.lm_head is model.embed
    cache = model.new_cache(16)
    assert isinstance(cache, HybridCache) and cache.kv.k.shape[0] == 2 and cache.state.S.shape == (6, 4, 16, 16)
    assert cache.state.S.dtype == torch.float32

    flat = tmp_path / "flat"
    flat.mkdir()
    text = json.loads((d / "config.json").read_text())["text_config"]
    (flat / "config.json").write_text(json.dumps(dict(text, tie_word_embeddings=True)))
    tensors = {k.replace("model.language_model.", "model."): v for k, v in load_file(str(d / "model.safetensors")).items()
               if k.startswith("model.language_model.")}
    save_sharded(tensors, flat)
    ids = torch.tensor([1, 2, 3, 4, 5])
    again = Qwen35Model.load(flat)
    a = model.forward(ids, 0, model.new_cache(16), all_logits=True).logits
    b = again.forward(ids, 0, again.new_cache(16), all_logits=True).logits
    assert torch.equal(a, b)


def test_loading_errors(tmp_path):
    d = make_qwen35(tmp_path / "t", seed=4, with_tokenizer=False)
    raw = json.loads((d / "config.json").read_text())
    raw["text_config"]["layer_types"] = ["linear_attention"] * 3
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DflashError, match="layer_types"):
        Qwen35Model.load(d)
    d = make_qwen35(tmp_path / "u", seed=4, with_tokenizer=False)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.language_model.layers.0.linear_attn.A_log"]
    save_sharded(tensors, d)
    with pytest.raises(DflashError, match="missing tensors: model.layers.0.linear_attn.A_log"):
        Qwen35Model.load(d)


def test_registry_entries():
    from dflash_cli.registry import Registry

    reg = Registry.load()
    for size in ("0.8b", "2b", "4b", "9b"):
        e = reg.entries[f"qwen3.5-{size}"]
        assert e.target.ref == f"Qwen/Qwen3.5-{size.upper()}"
        assert e.generation["top_k"] == 20 and e.generation["temperature"] == 1.0
    assert reg.entries["qwen3.5-4b"].drafters["dflash"].ref == "z-lab/Qwen3.5-4B-DFlash"
    assert reg.entries["qwen3.5-9b"].drafters["dflash"].ref == "z-lab/Qwen3.5-9B-DFlash"
    assert not reg.entries["qwen3.5-0.8b"].drafters


def test_synthetic_shapes():
    """--synthetic's Qwen3.5 shapes (the text tower's parameters as published: 0.75B ... 8.95B), and a shrunk one runs."""
    import math

    from dflash_cli.synthetic import random_target, target_config, target_shapes

    want = {"qwen3.5-0.8b": 0.752, "qwen3.5-2b": 1.882, "qwen3.5-4b": 4.206, "qwen3.5-9b": 8.954}
    for name, billions in want.items():
        cfg = target_config(name)
        assert isinstance(cfg, Qwen35Config) and cfg.vocab_size == 248320 and cfg.rotary_dim == 64
        assert abs(sum(math.prod(s) for s in target_shapes(cfg).values()) / 1e9 - billions) < 1e-3
    model = random_target("qwen3.5-4b", "cpu", torch.float32, vocab_size=512, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                          head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=64)
    assert isinstance(model, Qwen35Model)
    out = model.forward(torch.tensor([1, 2, 3]), 0, model.new_cache(8))
    assert out.logits.shape == (1, 512) and torch.isfinite(out.logits).all()


def test_history_drops_thinking_the_template_opened():
    """Qwen3.5's generation prompt opens the thinking block itself: the answer starts inside it."""
    from dflash_cli.conversation import Conversation

    conv = Conversation(tokenizer=None)
    conv.add_exchange("q1", "let me think\n</think>\n\nfour")
    conv.add_exchange("q2", "<think>\nhmm\n</think>\n\nfive")
    conv.add_exchange("q3", "six")
    assert [m["content"] for m in conv.messages[1::2]] == ["four", "five", "six"]
