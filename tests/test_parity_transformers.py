"""Our Qwen3 against transformers' Qwen3ForCausalLM on the same random checkpoint (float32, CPU)."""

import pytest
import torch

from dflash_cli.models.qwen3 import Qwen3Model

transformers = pytest.importorskip("transformers")


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def pair(tiny_model):
    ref = transformers.Qwen3ForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return Qwen3Model.load(tiny_model), ref


def test_prefill_and_20_cached_decode_steps_match(pair):
    ours, ref = pair
    torch.manual_seed(0)
    ids = torch.randint(0, 300, (17,))
    cache = ours.new_cache(64)
    out = ours.forward(ids, 0, cache, all_logits=True, capture=(0, 2, 4))
    with torch.no_grad():
        r = ref(ids[None], use_cache=True, output_hidden_states=True)
    assert rel_err(out.logits, r.logits[0]) <= 1e-4
    h = ours.cfg.hidden_size
    for j, idx in enumerate((0, 2, 4)):
        expect = r.hidden_states[idx][0] if idx < 4 else None
        if expect is not None:
            assert rel_err(out.hidden[:, j * h : (j + 1) * h], expect) <= 1e-4
    past, pos = r.past_key_values, ids.shape[0]
    tok = int(r.logits[0, -1].argmax())
    for _ in range(20):
        o = ours.forward(torch.tensor([tok]), pos, cache)
        with torch.no_grad():
            r = ref(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        assert rel_err(o.logits[-1], r.logits[0, -1]) <= 1e-4
        past, pos, tok = r.past_key_values, pos + 1, int(r.logits[0, -1].argmax())


def test_tied_embeddings_match(tmp_path):
    from tiny import make_qwen3

    d = make_qwen3(tmp_path / "tied", seed=3, tie_word_embeddings=True)
    ours = Qwen3Model.load(d)
    ref = transformers.Qwen3ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.arange(5, 40)
    with torch.no_grad():
        expect = ref(ids[None]).logits[0]
    assert rel_err(ours.forward(ids, 0, ours.new_cache(64), all_logits=True).logits, expect) <= 1e-4


def test_cli_greedy_tokens_equal_transformers_generate(pair, tiny_model, cli):
    _, ref = pair
    prompt = "def fibonacci(n):\n    return"
    res = cli("generate", "--model", tiny_model, "--raw", "--temperature", "0", "--max-tokens", "24", "--json",
              "-p", prompt)
    assert res.code == 0, res.err
    data = res.json()
    from dflash_cli.loading.tokenizer import ChatTokenizer

    tok = ChatTokenizer(tiny_model)
    ids = torch.tensor([tok.encode(prompt)])
    assert data["prompt_tokens"] == ids.shape[1]
    with torch.no_grad():
        out = ref.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=tok.stop_ids, pad_token_id=0)
    assert data["tokens"] == out[0, ids.shape[1]:].tolist()
    assert data["finish_reason"] in ("stop", "length")
