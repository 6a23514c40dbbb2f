"""`dflash chat`: the REPL's commands over stdin, KV-cache reuse between turns, Ctrl-C and a full context."""

import io
import json
import re

import pytest
import torch
from rich.console import Console

from dflash_cli.commands import chat as chat_cmd
from dflash_cli.commands.chat import ChatOptions, ChatRepl
from dflash_cli.conversation import Conversation
from dflash_cli.runtime.generation import PlainDecoder, Request, Step, generate
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.bundle import open_bundle
from dflash_cli.registry import Registry
from dflash_cli.ui.stream import StreamView

GREEDY = SamplingParams()


@pytest.fixture
def chat(cli, tiny_model, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")

    def run(stdin, *flags):
        return cli("chat", tiny_model, "--draft", "none", "--temperature", "0", "--max-tokens", "4", *flags, stdin=stdin)

    return run


@pytest.fixture
def prompts(monkeypatch):
    """The prompt ids (with the pending token) each chat turn fed to the model."""
    seen, real = [], chat_cmd.generate

    def spy(session, decoder, req, **kw):
        seen.append(session.pending + req.prompt_ids)
        return real(session, decoder, req, **kw)

    monkeypatch.setattr(chat_cmd, "generate", spy)
    return seen


def clean(res):
    assert res.code == 0, (res.out, res.err)
    assert "Traceback" not in res.out + res.err and "error" not in res.err
    return res.out


def test_two_turns_save_and_exit(chat, tmp_path):
    saved = tmp_path / "chat.json"
    out = clean(chat(f"Hello there\nAnd then?\n/save {saved}\n/exit\nnever read\n/save {tmp_path / 'late.json'}\n"))
    assert f"saved 4 messages to {saved}" in out
    data = json.loads(saved.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [m["content"] for m in data["messages"][::2]] == ["Hello there", "And then?"]
    assert not (tmp_path / "late.json").exists()


def test_clear_empties_the_conversation_and_the_cache(chat, tmp_path, prompts):
    out = clean(chat(f"Hello\n/clear\n/stats\nHello\n/save {tmp_path / 'c.json'}\n"))
    assert "conversation cleared" in out and re.search(r"context 0/\d+ tokens · 0 turns", out)
    assert len(json.loads((tmp_path / "c.json").read_text())["messages"]) == 2
    assert prompts[1] == prompts[0]  # after /clear the same first turn is prefilled from scratch


def test_system_prompt_heads_the_reprefilled_conversation(chat, tmp_path, prompts, tiny_model):
    from dflash_cli.loading.tokenizer import ChatTokenizer

    tok = ChatTokenizer(tiny_model)
    out = clean(chat(f"Hi\n/system Be brief.\nAgain\n/system\n/save {tmp_path / 's.json'}\n"))
    assert "system prompt set" in out and "system prompt removed" in out
    second = tok.decode(prompts[1])
    assert second.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>")
    assert second.endswith("<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n")
    assert json.loads((tmp_path / "s.json").read_text())["system"] is None


def test_think_switch(chat, prompts, tiny_model):
    from dflash_cli.loading.tokenizer import ChatTokenizer

    tok = ChatTokenizer(tiny_model)
    out = clean(chat("/think off\nHi\n/clear\n/think on\nHi\n/think maybe\n"))
    assert "thinking off" in out and "thinking on" in out and "usage: /think on|off" in out
    assert tok.decode(prompts[0]).endswith("assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(prompts[1]).endswith("assistant\n")


def test_stats_unknown_command_and_eof(chat):
    out = clean(chat("Hi\n/stats\n/frobnicate\nHi again\n/stats\n"))  # ends without /exit: EOF leaves
    assert "unknown command /frobnicate" in out and "/exit" in out
    assert re.search(r"context \d+/512 tokens · 1 turn\n", out)
    assert re.search(r"context \d+/512 tokens · 2 turns", out)
    assert "last answer:" in out and "session:" in out
    assert clean(chat("")) == ""


def test_full_context_drops_the_oldest_turns_and_keeps_answering(chat, prompts):
    """Before: once full, every turn was refused until /clear. Now the oldest turns go, the system prompt stays."""
    turns = [f"Message {i}" for i in range(6)]
    out = clean(chat("\n".join(turns) + "\n/stats\n", "--context", "64", "--max-tokens", "8", "--system", "S."))
    assert len(prompts) == 6, out  # every message was answered
    dropped = [line for line in out.splitlines() if "dropped the oldest" in line]
    assert dropped and "system prompt stays" in dropped[0]
    assert "/clear" not in out and "context is full (" not in out
    assert re.search(r"context \d+/64 tokens", out)


def test_a_message_too_long_for_the_context_keeps_the_conversation(chat, tmp_path, prompts):
    """Before: the turns were dropped one by one while looking for room, and then the message was refused anyway:
    the whole conversation was gone."""
    saved = tmp_path / "c.json"
    out = clean(chat(f"Hello\n{'word ' * 200}\n/stats\n/save {saved}\nAgain\n", "--context", "64",
                     "--max-tokens", "8"))
    assert "shorten it" in out and "dropped the oldest" not in out
    assert re.search(r"context \d+/64 tokens · 1 turn\n", out), out
    assert [m["content"] for m in json.loads(saved.read_text())["messages"]][::2] == ["Hello"]
    assert len(prompts) == 2 and len(prompts[1]) < len(prompts[0]) + 16  # the next turn extends the cache


def test_piped_messages_are_not_broken_at_80_columns(chat, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    out = clean(chat("/set\n/set nope 1\n"))
    settings = r"^temperature 0 · top_p [\d.]+ · top_k \d+ · max_tokens 4 · draft none · draft_len —$"
    assert re.search(settings, out, re.M)
    assert "\nunknown setting nope: temperature, top_p, top_k, max_tokens, draft, draft_len\n" in "\n" + out, out


def test_history_keeps_the_answer_as_written():
    """Before: the answer was stripped, and a code answer's first indent and newline were lost from /save and from
    the history re-read after /load or a full context."""
    conv = Conversation(tokenizer=None)
    conv.add_exchange("def add(a, b):", "\n    return a + b\n")
    conv.add_exchange("q", "<think>\nhmm\n</think>\n\nfive")
    assert [m["content"] for m in conv.messages[1::2]] == ["\n    return a + b\n", "five"]


def test_default_answer_budget_fits_the_context(cli, tiny_model, monkeypatch):
    from dflash_cli.commands.chat import default_max_tokens

    assert default_max_tokens(1024) == 512 and default_max_tokens(32768) == 2048
    res = cli("chat", tiny_model, "--draft", "none", "--context", "32", "--max-tokens", "40")
    assert res.code == 1 and "does not fit the context of 32" in res.err


def test_context_flag_out_of_range(cli, tiny_model):
    res = cli("chat", tiny_model, "--draft", "none", "--context", "8")
    assert res.code == 1 and res.err.strip() == "error: --context must be between 16 and 512 (got 8)"


# KV reuse, driven through the library the REPL uses.

@pytest.fixture(scope="module")
def bundle(tiny_model):
    b = open_bundle(Registry.load().resolve(str(tiny_model)), "cpu", "float32")
    b.load_model()
    return b


class Scripted:
    """A decoder that answers with fixed tokens (forwarding each, as a real decoder does)."""

    kind = "scripted"

    def __init__(self, tokens, vocab):
        self.tokens, self.vocab = iter(tokens), vocab

    def _next(self):
        logits = torch.zeros(self.vocab)
        logits[next(self.tokens)] = 1.0
        return logits

    def prefill(self, session, ids):
        session.forward(ids)
        return self._next()

    def step(self, session, last, budget, params):
        session.forward([last])
        return Step(emitted=[int(self._next().argmax())])

    def sync(self, session):
        pass


def _record_forwards(session):
    fed, real = [], session.forward

    def forward(ids, *a, **k):
        fed.append(list(ids))
        return real(ids, *a, **k)

    session.forward = forward
    return fed


def test_second_turn_prefills_only_its_tokens_and_matches_a_fresh_prompt(bundle):
    tok, model = bundle.tokenizer, bundle.model
    im_end = tok.tok.token_to_id("<|im_end|>")
    session, conv = Session(model, 256), Conversation(tok)

    ids1, reset = conv.prompt_ids("What is two plus two?", session.pending, fresh=True)
    assert reset
    answer = tok.encode("It is four.") + [im_end]
    r1 = generate(session, Scripted(answer, model.cfg.vocab_size), Request(ids1, GREEDY, 20, tok.stop_ids))
    assert r1.tokens == answer and r1.finish_reason == "stop"
    conv.add_exchange("What is two plus two?", tok.decode(answer[:-1]))

    ids2, reset = conv.prompt_ids("And three plus three?", session.pending, fresh=False)
    assert not reset
    assert tok.decode(ids2) == "\n<|im_start|>user\nAnd three plus three?<|im_end|>\n<|im_start|>assistant\n"
    fed = _record_forwards(session)
    r2 = generate(session, PlainDecoder(), Request(ids2, GREEDY, 8, tok.stop_ids))
    assert fed[0] == [im_end] + ids2  # the pending end-of-turn token and the new turn, nothing older
    assert r2.prompt_tokens == len(ids2)

    whole = tok.encode(tok.render_chat(conv.all_messages([{"role": "user", "content": "And three plus three?"}])))
    assert whole == ids1 + answer + ids2
    fresh = generate(Session(model, 256), PlainDecoder(), Request(whole, GREEDY, 8, tok.stop_ids))
    assert r2.tokens == fresh.tokens


def test_cached_turns_equal_one_fresh_prefill_of_the_same_tokens(bundle):
    tok, model = bundle.tokenizer, bundle.model
    session, conv = Session(model, 256), Conversation(tok, system="Be brief.")
    history = []
    for i, text in enumerate(["Hello", "Tell me more.", "Thanks!"]):
        ids, reset = conv.prompt_ids(text, session.pending, fresh=i == 0)
        assert reset == (i == 0)
        result = generate(session, PlainDecoder(), Request(ids, GREEDY, 5, tok.stop_ids))
        fresh = generate(Session(model, 256), PlainDecoder(), Request(history + ids, GREEDY, 5, tok.stop_ids))
        assert result.tokens == fresh.tokens
        history += ids + result.tokens
        assert session.length + len(session.pending) == len(history)
        conv.add_exchange(text, tok.decode([t for t in result.tokens if t not in tok.stop_ids]))


# Ctrl-C inside an answer.

@pytest.fixture
def repl(tiny_model, prompts):
    o = ChatOptions(model=str(tiny_model), temperature=0.0, max_tokens=12, draft="none")
    return ChatRepl(o, Console(file=io.StringIO(), width=200))


def test_ctrl_c_stops_the_answer_and_the_session_goes_on(repl, prompts, monkeypatch):
    repl.bundle.tokenizer.stop_ids = []  # a model that never stops by itself
    real, calls = StreamView.on_step, []

    def on_step(self, step):  # Ctrl-C while the third step's text is shown
        calls.append(step)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(self, step)

    with monkeypatch.context() as m:
        m.setattr(StreamView, "on_step", on_step)
        repl.answer("Tell me a long story.")
    first = repl.results[-1]
    assert first.interrupted and len(first.tokens) == 3  # the third step's token was already committed
    assert "[stopped]" in repl.console.file.getvalue()
    assert len(repl.conv.messages) == 2  # the partial answer stays in the conversation

    repl.answer("Go on.")
    second = repl.results[-1]
    assert not second.interrupted and second.tokens
    history = prompts[0] + first.tokens[:-1] + prompts[1]  # prompts include the pending token
    fresh = generate(Session(repl.session.model, 256), PlainDecoder(),
                     Request(history, GREEDY, 12, repl.bundle.tokenizer.stop_ids))
    assert second.tokens == fresh.tokens


def test_ctrl_c_before_the_first_token_leaves_no_trace(repl, prompts, monkeypatch):
    repl.answer("Hi")
    state = (repl.session.length, list(repl.session.pending), list(repl.conv.messages))

    def interrupted_prefill(self, session, ids):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(PlainDecoder, "prefill", interrupted_prefill)
        repl.answer("Never mind")
    assert "[stopped]" in repl.console.file.getvalue()
    assert (repl.session.length, repl.session.pending, repl.conv.messages) == state
    repl.answer("Hi again")
    assert len(repl.conv.messages) == 4 and repl.results[-1].tokens


def test_ctrl_c_at_the_prompt_does_not_leave(chat, monkeypatch):
    lines = iter([KeyboardInterrupt, "Hi\n", "/exit\n"])

    def read_line():
        line = next(lines)
        if line is KeyboardInterrupt:
            raise KeyboardInterrupt
        return line

    monkeypatch.setattr(chat_cmd, "_read_line", read_line)
    res = chat("", "--max-tokens", "2")
    assert res.code == 0 and "Traceback" not in res.err
    assert next(lines, None) is None  # every line was read


def test_ctrl_c_in_a_command_keeps_the_conversation(chat, prompts, monkeypatch, tmp_path):
    """/set draft may download and load a drafter for minutes: a Ctrl-C there stops the command, not the chat (the
    KeyboardInterrupt left run() and the conversation was lost)."""
    real = chat_cmd.make_decoder

    def make_decoder(bundle, draft, *a, **kw):
        if draft == "dflash":
            raise KeyboardInterrupt
        return real(bundle, draft, *a, **kw)

    saved = tmp_path / "chat.json"
    monkeypatch.setattr(chat_cmd, "make_decoder", make_decoder)
    out = clean(chat(f"Hi\n/set draft dflash\nAnd?\n/save {saved}\n"))
    assert "interrupted: /set stopped; the conversation is kept" in out
    assert [m["content"] for m in json.loads(saved.read_text())["messages"][::2]] == ["Hi", "And?"]


# Issue 43: /help, /set, /load, multi-line input, /think on a model without thinking, honest stats.

def test_help_is_a_command(chat):
    """Before: `/help` was an "unknown command"."""
    out = clean(chat("/help\n"))
    assert "unknown command" not in out and "/set NAME VALUE" in out and "/load FILE" in out


def test_set_changes_settings_and_rejects_bad_values(chat, prompts):
    out = clean(chat("/set temperature 0.5\n/set top_k 7\n/set max_tokens 3\n/set draft none\n/set top_p lots\n"
                     "/set colour blue\n/set temperature -1\n/set\nHi\n/stats\n"))
    assert re.search(r"temperature 0.5 · top_p [\d.]+ · top_k 7 · max_tokens 3 · draft none", out)
    assert "not a number: lots" in out and "unknown setting colour" in out
    assert "error: temperature must be a finite number >= 0 (got -1.0)" in out and "--temperature" not in out
    assert re.search(r"last answer: [1-3] tok", out)


def test_load_continues_a_saved_conversation(chat, tmp_path, prompts, tiny_model):
    from dflash_cli.loading.tokenizer import ChatTokenizer

    saved = tmp_path / "c.json"
    clean(chat(f"/system Be brief.\nFirst question\n/save {saved}\n"))
    out = clean(chat(f"/load {saved}\nSecond question\n/stats\n/load {tmp_path / 'nope.json'}\n"))
    assert "loaded 2 messages" in out and "1 turns" not in out and re.search(r"· 2 turns", out)
    assert "error: cannot load" in out
    second = ChatTokenizer(tiny_model).decode(prompts[-1])
    assert second.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nFirst question<|im_end|>")


def test_triple_quotes_make_one_multi_line_message(chat, prompts, tiny_model):
    from dflash_cli.loading.tokenizer import ChatTokenizer

    clean(chat('"""\nclass A:\n    x = 1\n"""\n/stats\n'))
    assert len(prompts) == 1
    assert "user\nclass A:\n    x = 1<|im_end|>" in ChatTokenizer(tiny_model).decode(prompts[0])


def test_think_on_a_model_without_thinking_says_so(cli, monkeypatch):
    """Before: `/think on` on the demo (no thinking mode) answered "thinking on"."""
    monkeypatch.setenv("COLUMNS", "250")
    res = cli("chat", "demo", "--draft", "none", "--max-tokens", "2", stdin="/think on\n")
    assert res.code == 0 and "has no thinking mode" in res.out and "thinking on" not in res.out


def test_flags_that_do_nothing_here_are_a_warning_line(cli, monkeypatch):
    """Before: `chat demo --think` and `--draft none --draft-len 3` were silently ignored."""
    monkeypatch.setenv("COLUMNS", "250")
    res = cli("chat", "demo", "--draft", "none", "--draft-len", "3", "--think", "--max-tokens", "2", stdin="")
    assert res.code == 0 and res.err.splitlines() == [
        "warning: --draft-len 3 is ignored: plain decoding (--draft none) drafts nothing",
        "warning: --think: demo has no thinking mode (its chat template ignores it)"], res.err


def test_interrupted_answer_stats_are_honest(repl, monkeypatch):
    """Before: /stats showed 0.0 tok/s for an interrupted answer."""
    import time

    repl.bundle.tokenizer.stop_ids = []
    real, calls = StreamView.on_step, []

    def on_step(self, step):
        calls.append(step)
        time.sleep(0.005)
        if len(calls) == 6:
            raise KeyboardInterrupt
        real(self, step)

    with monkeypatch.context() as m:
        m.setattr(StreamView, "on_step", on_step)
        repl.answer("Tell me a long story.")
    repl.print_stats()
    out = repl.console.file.getvalue()
    assert repl.results[-1].decode_tok_per_s > 0 and "finish interrupted" in out
    assert re.search(r"last answer: 6 tok · [1-9][\d.]* tok/s", out)


def test_model_may_be_given_as_a_flag_as_in_generate(cli, tiny_model, monkeypatch):
    """Before: `dflash chat --model demo` ended 'No such option: --model (Possible options: --help)'."""
    monkeypatch.setenv("COLUMNS", "250")
    res = cli("chat", "--model", tiny_model, "--draft", "none", "--max-tokens", "2", stdin="hi\n/stats\n")
    assert res.code == 0 and "1 turn\n" in res.out, (res.out, res.err)
    res = cli("chat", tiny_model, "-m", "demo", stdin="")
    assert res.code == 1 and res.err.startswith("error: two models given"), res.err


# A newcomer's trial: /help at the terminal's width, /load and /set errors in the chat's words, plurals, /stats
# after /load.

@pytest.mark.parametrize("width", [80, 100])
def test_help_fits_the_terminal_in_two_aligned_columns(repl, width):
    """Before: wrapped by hand for about 120 columns, ragged at 80 and 100."""
    repl.console = Console(file=io.StringIO(), width=width)
    repl.command("/help")
    lines = repl.console.file.getvalue().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    column = lines[0].index("this list")
    keys = ("/help", "/set NAME VALUE", "/load FILE", "/save FILE", "/clear", "/system TEXT", "/think on|off", "/stats",
            "/exit", "input", "footer")
    assert all(line[:column].strip() == "" or line[:column].rstrip() in keys for line in lines)  # wrapped lines align
    assert len(lines) > 12  # the long rows wrapped, under their own column
    assert "accept % by draft position" in "".join(lines)


def test_load_says_what_is_missing(chat, tmp_path):
    """Before: a JSON file without messages said `error: cannot load X: 'messages'` (a bare KeyError)."""
    (tmp_path / "other.json").write_text('{"model": "x"}')
    (tmp_path / "roles.json").write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}')
    (tmp_path / "broken.json").write_text('{"messages": [')
    out = clean(chat(f"/load {tmp_path / 'other.json'}\n/load {tmp_path / 'roles.json'}\n"
                     f"/load {tmp_path / 'broken.json'}\n"))
    assert f'error: cannot load {tmp_path / "other.json"}: no "messages" in it' in out
    assert "message 2 has no content text" in out
    assert f"cannot load {tmp_path / 'broken.json'}: not JSON (" in out and "line 1" in out


def test_set_errors_name_the_setting_not_the_flag(chat):
    """Before: `/set top_p 2` said `error: --top-p must be ...`, a flag chat has no use for."""
    out = clean(chat("/set top_p 2\n/set top_k -1\n/set draft_len 0\n/set\n"))
    assert "error: top_p must be in (0, 1] (got 2.0)" in out and "error: top_k must be >= 0 (got -1)" in out
    assert "error: draft_len must be >= 1 (got 0)" in out and "--" not in out
    assert re.search(r"temperature 0 · top_p [\d.]+ · top_k \d+ ·", out)  # nothing changed


def test_counts_are_singular_for_one_and_stats_after_load_say_when_the_turns_are_read(chat, tmp_path):
    """Before: `1 turns`, `1 answers`, and after /load `/stats` said `context 0/512 tokens · 2 turns` as if the
    loaded conversation took no room (it is read into the cache with the next message)."""
    saved = tmp_path / "c.json"
    out = clean(chat(f"Hi\n/stats\n/save {saved}\n"))
    assert "· 1 turn\n" in out and "in 1 answer ·" in out and "saved 2 messages" in out
    out = clean(chat(f"/load {saved}\n/stats\nAgain\n/stats\n"))
    waiting = re.search(r"context 0/512 tokens · 1 turn \((\d+) tokens\), read into the cache with the next message",
                        out)
    assert waiting and int(waiting.group(1)) > 0, out
    after = re.search(r"context (\d+)/512 tokens · 2 turns\n", out)
    assert after and int(after.group(1)) > int(waiting.group(1))
