"""Chat template, stop ids, --raw encoding and UTF-8-safe streaming detokenization."""

import json
import random
import shutil

import pytest
from tokenizers import Tokenizer, processors

from dflash_cli.errors import DflashError
from dflash_cli.loading.tokenizer import ChatTokenizer, StreamDecoder

USER = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def tok(tiny_model):
    return ChatTokenizer(tiny_model)


def test_chat_template_roles_and_generation_prompt(tok):
    text = tok.render_chat([{"role": "system", "content": "Be brief."}] + USER)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is two plus two?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert tok.render_chat(USER, add_generation_prompt=False).endswith("two?<|im_end|>\n")


def test_thinking_switch(tok):
    assert tok.render_chat(USER, think=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.render_chat(USER, think=True).endswith("<|im_start|>assistant\n")
    assert tok.render_chat(USER).endswith("<|im_start|>assistant\n")  # the template's default: thinking


def test_special_tokens_in_the_rendered_prompt_are_single_ids(tok):
    ids = tok.encode(tok.render_chat(USER))
    im_start, im_end = tok.tok.token_to_id("<|im_start|>"), tok.tok.token_to_id("<|im_end|>")
    assert ids[0] == im_start and ids.count(im_start) == 2 and ids.count(im_end) == 1
    assert tok.decode(ids) == tok.render_chat(USER)


def _copy_tokenizer(src, dst, **config_changes):
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg.update(config_changes)
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def test_chat_template_jinja_file_wins_and_a_missing_template_is_a_clear_error(tiny_model, tmp_path):
    d = _copy_tokenizer(tiny_model, tmp_path / "jinja")
    (d / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    assert ChatTokenizer(d).render_chat(USER) == "[user] What is two plus two?\n"

    bare = _copy_tokenizer(tiny_model, tmp_path / "bare", chat_template=None)
    with pytest.raises(DflashError, match="no chat template.*--raw"):
        ChatTokenizer(bare).render_chat(USER)


def test_stop_ids_cover_generation_config_eos_and_end_of_turn(tok, tiny_model, tmp_path):
    im_end, eot = tok.tok.token_to_id("<|im_end|>"), tok.tok.token_to_id("<|endoftext|>")
    gen_eos = json.loads((tiny_model / "generation_config.json").read_text())["eos_token_id"]
    assert set(gen_eos) == {im_end, eot} and set(gen_eos) <= set(tok.stop_ids)

    # A base-model style checkpoint: eos is <|endoftext|>, no generation config, no eos in config.json.
    d = _copy_tokenizer(tiny_model, tmp_path / "base", eos_token="<|endoftext|>")
    assert ChatTokenizer(d).stop_ids == sorted({im_end, eot})


def _fresh_pieces(tok, ids, chunk=1):
    dec = StreamDecoder(tok)
    pieces = [dec.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return pieces, dec.flush()


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_stream_never_emits_half_a_character(tok, chunk):
    text = "héllo 🦊 wörld 日本語 € 𝄞!"
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some characters really are split over byte tokens
    pieces, tail = _fresh_pieces(tok, ids, chunk)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + tail == text and tail == ""


def test_flush_emits_what_was_held_back(tok):
    ids = tok.encode("ab🦊")
    pieces, tail = _fresh_pieces(tok, ids[:-1])  # the stream ends inside the 4-byte emoji
    assert "".join(pieces) == "ab"
    assert tail == "\ufffd"  # shown, not silently dropped


def test_stream_of_random_tokens_equals_the_one_shot_decode(tok):
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 25))]
        pieces, tail = _fresh_pieces(tok, ids, chunk=rng.choice([1, 1, 2, 4]))
        assert "".join(pieces) + tail == tok.decode(ids)


@pytest.fixture
def bos_model(tiny_model, tmp_path):
    """The tiny checkpoint with a post-processor that prepends <|endoftext|>, as BOS-adding tokenizers do."""
    d = tmp_path / "bos"
    shutil.copytree(tiny_model, d)
    t = Tokenizer.from_file(str(d / "tokenizer.json"))
    bos = t.token_to_id("<|endoftext|>")
    t.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    t.save(str(d / "tokenizer.json"))
    assert t.encode("hello").ids[0] == bos
    return d, t


def test_raw_prompt_is_encoded_as_is(bos_model, cli, monkeypatch):
    from dflash_cli.commands import generate as generate_cmd

    d, t = bos_model
    seen, real = [], generate_cmd.generate

    def spy(session, decoder, req, **kw):
        seen.append(req.prompt_ids)
        return real(session, decoder, req, **kw)

    monkeypatch.setattr(generate_cmd, "generate", spy)
    text = "def f(x):\n    return x"
    res = cli("generate", "--model", d, "--draft", "none", "--raw", "-p", text, "-n", "2", "--json")
    assert res.code == 0, res.err
    assert seen[0] == t.encode(text, add_special_tokens=False).ids  # no BOS, no template
    assert res.json()["prompt_tokens"] == len(seen[0])

    res = cli("generate", "--model", d, "--draft", "none", "-p", text, "-n", "2", "--json")
    assert ChatTokenizer(d).decode(seen[1]) == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
