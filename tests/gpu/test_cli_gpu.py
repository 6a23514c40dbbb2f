"""The CLI end to end on CUDA (graphs on): generate with each drafter, greedy and sampled, and a two-turn chat."""

import json

import pytest
import torch

from tiny import make_dflash, make_eagle3, make_qwen3

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-cli")
    # head_dim 64 so the Triton window attention is used, not the SDPA fallback.
    target = make_qwen3(root / "t", seed=21, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, num_hidden_layers=4, max_position_embeddings=1024)
    cfg = json.loads((target / "config.json").read_text())
    return target, make_dflash(root / "d", cfg, seed=22, block_size=8, target_layer_ids=[1, 2]), \
        make_eagle3(root / "e", cfg, seed=23)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_generate_each_drafter_on_cuda(cli, models, dtype):
    target, dflash, eagle = models
    runs = {}
    for name, draft in (("none", "none"), ("dflash", dflash), ("eagle3", eagle)):
        for temp in ("0", "0.8"):
            r = cli("generate", "--model", target, "--draft", draft, "--device", "cuda", "--dtype", dtype,
                    "--raw", "--prompt", "def fibonacci(n):", "--temperature", temp, "--seed", "3",
                    "--max-tokens", "48", "--json")
            assert r.code == 0, r.err
            runs[name, temp] = r.json()
            assert runs[name, temp]["stats"]["draft_kind"] == name
            assert runs[name, temp]["stats"]["graph_captures"] == 0  # every graph captured at load
    if dtype == "float32":  # exact equality is an fp32 property; bf16 may flip near-ties
        assert runs["none", "0"]["tokens"] == runs["dflash", "0"]["tokens"] == runs["eagle3", "0"]["tokens"]


def test_chat_two_turns_on_cuda(cli, models, tmp_path):
    target, dflash, _ = models
    save = tmp_path / "chat.json"
    r = cli("chat", target, "--draft", dflash, "--device", "cuda", "--temperature", "0", "--max-tokens", "24",
            stdin=f"hello there\nand again\n/stats\n/save {save}\n/exit\n")
    assert r.code == 0, r.err
    turns = json.loads(save.read_text())
    assert len([m for m in turns["messages"] if m["role"] == "assistant"]) == 2
