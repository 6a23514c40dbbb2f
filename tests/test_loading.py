"""Loading checkpoints: every broken one is one clear error (library and CLI); good layouts load identically."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dflash_cli.errors import DflashError
from dflash_cli.runtime.bundle import pick_device, pick_dtype
from dflash_cli.models.qwen3 import Qwen3Model
from tiny import make_qwen3, save_sharded

SHARD2 = "model-00002-of-00002.safetensors"


def assert_one_line_error(res, *needles):
    assert res.code == 1, (res.code, res.out, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err
    for needle in needles:
        assert needle in lines[0]


def _tensors(d):
    out = {}
    for f in d.glob("*.safetensors"):
        out.update(load_file(f))
    return out


def _rewrite_weights(d, edit):
    t = _tensors(d)
    edit(t)
    for f in [*d.glob("*.safetensors"), d / "model.safetensors.index.json"]:
        f.unlink()
    save_sharded(t, d, shards=2)


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


BAD_SHAPE = "model.layers.1.mlp.up_proj.weight"
EXTRA = "model.layers.0.mlp.extra_proj.weight"
GONE = "model.layers.3.self_attn.k_norm.weight"

# name -> (how to break a copy of the 2-shard tiny checkpoint, what the message must name)
BREAKAGES = {
    "missing shard": (lambda d: (d / SHARD2).unlink(), ["missing shard", SHARD2]),
    "wrong shape": (lambda d: _rewrite_weights(d, lambda t: t.__setitem__(BAD_SHAPE, torch.zeros(7, 64))),
                    ["wrongly shaped", BAD_SHAPE, "[7, 64]"]),
    "unexpected tensor": (lambda d: _rewrite_weights(d, lambda t: t.__setitem__(EXTRA, torch.zeros(3))),
                          ["unexpected tensors", EXTRA]),
    "missing tensor": (lambda d: _rewrite_weights(d, lambda t: t.pop(GONE)), ["missing tensors", GONE]),
    "unknown model_type": (lambda d: _edit_config(d, model_type="llama"), ["model_type 'llama'"]),
    "rope scaling": (lambda d: _edit_config(d, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                     ["rope_scaling", "yarn"]),
    "truncated shard": (lambda d: (d / SHARD2).write_bytes((d / SHARD2).read_bytes()[:5000]), ["cannot read", SHARD2]),
    "garbage shard": (lambda d: (d / SHARD2).write_bytes(os.urandom(4096)), ["cannot read", SHARD2]),
    "corrupt index": (lambda d: (d / "model.safetensors.index.json").write_text("{not json"), ["shard index"]),
    "no weights": (lambda d: [f.unlink() for f in d.glob("model*")], ["no safetensors weights"]),
    "missing config.json": (lambda d: (d / "config.json").unlink(), ["config", "not found"]),
}


@pytest.fixture(params=list(BREAKAGES))
def broken(request, tiny_model, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(tiny_model, d)
    breakage, needles = BREAKAGES[request.param]
    breakage(d)
    return d, needles


def test_broken_checkpoint_is_a_clear_error(broken):
    d, needles = broken
    with pytest.raises(DflashError) as info:
        Qwen3Model.load(d)
    for needle in needles:
        assert needle in str(info.value)


def test_broken_checkpoint_via_cli_is_one_error_line(broken, cli):
    d, needles = broken
    res = cli("generate", "--model", d, "--draft", "none", "-p", "hi", "-n", "2")
    assert_one_line_error(res, *needles)
    assert res.out == ""


def _logits(model_dir):
    model = Qwen3Model.load(model_dir)
    return model.forward(torch.arange(3, 40), 0, model.new_cache(64), all_logits=True).logits


def test_single_file_and_sharded_checkpoints_give_identical_logits(tmp_path):
    one = make_qwen3(tmp_path / "one", seed=7, shards=1, with_tokenizer=False)
    three = make_qwen3(tmp_path / "three", seed=7, shards=3, with_tokenizer=False)
    assert (one / "model.safetensors").is_file() and len(list(three.glob("*.safetensors"))) == 3
    assert torch.equal(_logits(one), _logits(three))


def test_tied_embeddings_load_and_equal_an_untied_copy(tmp_path):
    tied = make_qwen3(tmp_path / "tied", seed=5, shards=1, with_tokenizer=False, tie_word_embeddings=True)
    t = _tensors(tied)
    assert "lm_head.weight" not in t
    untied = tmp_path / "untied"
    untied.mkdir()
    cfg = json.loads((tied / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps(dict(cfg, tie_word_embeddings=False)))
    save_sharded({**t, "lm_head.weight": t["model.embed_tokens.weight"].clone()}, untied)
    assert torch.equal(_logits(tied), _logits(untied))

    # Some tied checkpoints still carry a (redundant) copy of the head: it is ignored, not an error.
    save_sharded({**t, "lm_head.weight": torch.zeros_like(t["model.embed_tokens.weight"])}, tied)
    assert torch.equal(_logits(tied), _logits(untied))


def test_device_and_dtype_names():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    for bad in ("gpu0", "meta", "cuda:x"):
        with pytest.raises(DflashError, match="--device"):
            pick_device(bad)
    with pytest.raises(DflashError, match="--dtype 'int8'"):
        pick_dtype("int8", torch.device("cpu"))


BAD_FLAGS = [
    (["--device", "gpu0"], "--device 'gpu0'"),
    (["--device", "meta"], "--device 'meta'"),
    (["--dtype", "int8"], "--dtype 'int8'"),
]
if not torch.cuda.is_available():
    BAD_FLAGS.append((["--device", "cuda"], "no CUDA device"))


@pytest.mark.parametrize("flags,needle", BAD_FLAGS)
def test_bad_device_or_dtype_flag_is_one_error_line(tiny_model, cli, flags, needle):
    assert_one_line_error(cli("generate", "--model", tiny_model, "--draft", "none", "-p", "hi", *flags), needle)


def test_bfloat16_on_cpu_generates(tiny_model, cli):
    res = cli("generate", "--model", tiny_model, "--draft", "none", "-p", "hi", "-n", "3", "--dtype", "bfloat16",
              "--device", "cpu", "--json")
    assert res.code == 0, res.err
    assert 1 <= len(res.json()["tokens"]) <= 3


def test_drafter_checkpoint_errors_say_whose_file_and_stay_short(tiny_model, cli, tmp_path):
    """Before: a drafter of another size was one 626-character line listing every tensor, and a corrupt file was
    `cannot read model.safetensors: ...` without saying whether it was the target's or the drafter's."""
    from tiny import make_dflash

    cfg = json.loads((tiny_model / "config.json").read_text())
    wide = make_dflash(tmp_path / "wide", dict(cfg, hidden_size=2 * cfg["hidden_size"]), layers=2)
    shutil.copy(make_dflash(tmp_path / "right", cfg, layers=2) / "config.json", wide / "config.json")
    res = cli("generate", "--model", tiny_model, "--draft", wide, "-p", "hi", "-n", "2")
    assert_one_line_error(res, "DFlash drafter", str(wide), "wrongly shaped", "more")
    assert len(res.err) < 400, res.err

    broken = make_dflash(tmp_path / "broken", cfg, layers=2)
    (broken / "model.safetensors").write_bytes(os.urandom(4096))
    res = cli("generate", "--model", tiny_model, "--draft", broken, "-p", "hi", "-n", "2")
    assert_one_line_error(res, "cannot read model.safetensors of the DFlash drafter", str(broken))


def test_transformers_save_pretrained_folder_generates_as_transformers(tmp_path, cli):
    """A user's own checkpoint as transformers writes it (sharded, tied head, rope_parameters): the same greedy text."""
    transformers = pytest.importorskip("transformers")
    from tiny import make_tokenizer

    d = tmp_path / "mine"
    d.mkdir()
    tok = make_tokenizer(d)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=5000.0, tie_word_embeddings=True))
    model.save_pretrained(d, max_shard_size="100KB")
    assert len(list(d.glob("*.safetensors"))) > 1
    ids = tok.encode("def fibonacci").ids
    want = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=None)[0, len(ids):]
    res = cli("generate", "--model", d, "--raw", "--draft", "none", "-p", "def fibonacci", "-n", "6", "--json")
    assert res.code == 0, res.err
    assert res.json()["tokens"] == want.tolist()


def test_a_drafter_given_as_the_model_says_so(tiny_model, cli, tmp_path):
    """Before: a DFlash drafter (model_type qwen3) failed on its missing tokenizer or on its tensors, an EAGLE-3 one
    on model_type 'llama'; neither said that it was a drafter."""
    from tiny import make_dflash, make_eagle3, make_tokenizer

    cfg = json.loads((tiny_model / "config.json").read_text())
    dflash = make_dflash(tmp_path / "dflash", cfg)
    make_tokenizer(dflash)
    for drafter, kind in ((dflash, "dflash"), (make_eagle3(tmp_path / "eagle3", cfg), "eagle3")):
        res = cli("generate", "--model", drafter, "-p", "hi", "-n", "2")
        assert_one_line_error(res, f"is a drafter ({kind})", f"--draft {drafter}")


def test_a_checkpoint_path_that_is_no_folder_says_so(tiny_model, cli, tmp_path):
    """Before: a .safetensors file or a missing ./folder was looked up as a Hub repo id ('cannot reach the Hub') or
    as an unknown registry name."""
    weights = next(tiny_model.glob("*.safetensors"))
    for flags, needle in ((["--model", weights], "is a file"), (["--model", tmp_path / "gone"], "no such folder"),
                          (["--model", "./gone"], "no such folder"),
                          (["--model", tiny_model, "--draft", weights], "is a file"),
                          (["--model", tiny_model, "--draft", "./gone"], "no such folder")):
        res = cli("generate", *flags, "-p", "hi", "-n", "2")
        assert_one_line_error(res, needle)
