"""`dflash generate`, `dflash models` and `--help` end to end on the tiny checkpoint (plain decoding)."""

import json
import os
import re

import pytest

from dflash_cli.commands import generate as generate_cmd
from dflash_cli.loading.tokenizer import ChatTokenizer
from dflash_cli.models.qwen3 import Qwen3Model

GREEDY = ("--temperature", "0")


@pytest.fixture
def gen(cli, tiny_model):
    def run(*args, stdin=""):
        return cli("generate", "--model", tiny_model, "--draft", "none", *args, stdin=stdin)

    return run


@pytest.fixture
def prompts(monkeypatch):
    """The prompt ids each generation was asked to continue."""
    seen, real = [], generate_cmd.generate

    def spy(session, decoder, req, **kw):
        seen.append(req.prompt_ids)
        return real(session, decoder, req, **kw)

    monkeypatch.setattr(generate_cmd, "generate", spy)
    return seen


@pytest.fixture
def tok(tiny_model):
    return ChatTokenizer(tiny_model)


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if the target weights get loaded (input must be rejected before that work)."""

    def refuse(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(Qwen3Model, "load", refuse)


def assert_one_line_error(res, *needles, code=1):
    assert res.code == code, (res.code, res.out, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err
    for needle in needles:
        assert needle in lines[0]


def test_help(cli):
    res = cli("--help")
    assert res.code == 0
    assert all(c in res.out for c in ("generate", "chat", "models", "pull"))
    res = cli("generate", "--help")
    assert res.code == 0 and "--prompt-file" in res.out and "--json" in res.out


def test_help_shows_no_value_beside_flags_and_one_type_per_value(cli, monkeypatch):
    """Before: `--json <bool>`, `--help <bool>` (flags take no value), `--data <list[Path]>`, and generate's
    --api-key spoke of serve."""
    monkeypatch.setenv("COLUMNS", "200")
    for command in (["--help"], ["generate", "--help"], ["chat", "--help"], ["train", "--help"]):
        res = cli(*command)
        assert res.code == 0 and "<bool>" not in res.out and "list[" not in res.out, res.out
    gen = cli("generate", "--help").out
    assert re.search(r"--max-tokens +-n +<int>", gen) and re.search(r"--json +Print", gen)
    api_key = next(line for line in gen.splitlines() if "--api-key" in line)
    assert "with --url" in api_key and "clients must send" not in api_key, api_key
    assert re.search(r"--data +<path> +A folder", cli("train", "--help").out)


def test_prompt_flag_file_and_stdin_agree(gen, prompts, tmp_path):
    text = "Explain recursion.\nBriefly."
    (tmp_path / "p.txt").write_text(text)
    runs = [gen("-p", text, "-n", "4", "--json", *GREEDY),
            gen("--prompt-file", tmp_path / "p.txt", "-n", "4", "--json", *GREEDY),
            gen("-n", "4", "--json", *GREEDY, stdin=text)]
    assert all(r.code == 0 for r in runs), [r.err for r in runs]
    assert prompts[0] == prompts[1] == prompts[2]
    assert runs[0].json()["tokens"] == runs[1].json()["tokens"] == runs[2].json()["tokens"]


def test_prompt_file_dash_is_stdin(gen, prompts):
    """Before: `--prompt-file -` looked for a file named '-'."""
    runs = [gen("--prompt-file", "-", "-n", "2", "--json", *GREEDY, stdin="Explain recursion."),
            gen("-p", "Explain recursion.", "-n", "2", "--json", *GREEDY)]
    assert [r.code for r in runs] == [0, 0], [r.err for r in runs]
    assert prompts[0] == prompts[1]
    assert_one_line_error(gen("-f", "-", stdin="  \n"), "only whitespace (stdin)")


def test_flags_that_do_nothing_here_are_a_warning_line(cli, gen):
    """Before: `--draft none --draft-len 3`, and --think on the demo (no thinking mode), were silently ignored."""
    res = gen("-p", "hi", "-n", "2", "--json", "--draft-len", "3")
    assert res.code == 0 and res.err == "warning: --draft-len 3 is ignored: plain decoding (--draft none) drafts nothing\n"
    res = cli("generate", "-p", "def f", "-n", "2", "--json", "--think")
    assert res.code == 0 and res.err == "warning: --think: demo has no thinking mode (its chat template ignores it)\n"
    res = gen("-p", "hi", "-n", "2", "--json", "--raw", "--no-think")
    assert res.code == 0 and res.err == "warning: --no-think is ignored with --raw (no chat template)\n"
    assert gen("-p", "hi", "-n", "2", "--json", "--think").err == ""  # the tiny model's template has one


def test_max_tokens_past_the_context_ends_at_the_context(gen):
    """generate's -n is a ceiling (as serve's max_tokens): an answer that reaches the context's end stops there, says
    so (finish reason 'context', the footer's [context]) and --help says it; chat's -n is per answer in a conversation
    that has to fit, so there it is an error."""
    res = gen("-p", "hi", "-n", "99999999", "--context", "24", "--json", "--no-repeat-guard", *GREEDY)
    data = res.json()
    assert res.code == 0 and data["finish_reason"] in ("context", "stop"), res.err
    assert data["prompt_tokens"] + len(data["tokens"]) <= 24
    assert "where the context is full" in re.sub(r"[\s│]+", " ", gen("--help").out)


def test_system_think_and_raw_shape_the_prompt(gen, prompts, tok):
    for flags in (["--system", "Be brief."], ["--no-think"], ["--think"], ["--raw"]):
        assert gen("-p", "hi", "-n", "1", "--json", *flags).code == 0
    system, no_think, think, raw = (tok.decode(p) for p in prompts)
    assert system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>")
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert think.endswith("<|im_start|>assistant\n")
    assert raw == "hi"


def test_greedy_and_seeded_sampling_are_reproducible(gen):
    def tokens(*flags):
        res = gen("-p", "Tell me a story.", "-n", "8", "--json", *flags)
        assert res.code == 0, res.err
        return res.json()["tokens"]

    greedy = tokens(*GREEDY)
    assert tokens(*GREEDY) == greedy
    assert tokens("--temperature", "1.5", "--top-k", "1") == greedy  # top-k 1 leaves only the argmax
    assert tokens("--temperature", "1.5", "--top-p", "1e-6") == greedy  # so does a vanishing top-p
    hot = ("--temperature", "2.0", "--top-p", "1.0", "--top-k", "0")
    seeded = tokens(*hot, "--seed", "7")
    assert tokens(*hot, "--seed", "7") == seeded
    assert any(tokens(*hot, "--seed", str(s)) != seeded for s in (1, 2, 3))


def test_json_fields_and_max_tokens(gen, tok):
    res = gen("-p", "hi", "-n", "5", "--json", *GREEDY)
    assert res.code == 0, res.err
    data = res.json()
    assert set(data) >= {"text", "tokens", "prompt_tokens", "finish_reason", "stats"}
    tokens, stats = data["tokens"], data["stats"]
    assert 1 <= len(tokens) <= 5
    stops = set(tok.stop_ids)
    if data["finish_reason"] == "length":
        assert len(tokens) == 5 and not stops & set(tokens)
    else:
        assert data["finish_reason"] == "stop" and tokens[-1] in stops
    assert data["text"] == tok.decode([t for t in tokens if t not in stops])
    assert data["prompt_tokens"] == len(tok.encode(tok.render_chat([{"role": "user", "content": "hi"}])))
    assert stats["ttft_s"] > 0 and stats["decode_tok_per_s"] >= 0
    assert stats["steps"] == len(tokens) - 1  # plain decoding: one token per step after the first
    assert stats["draft_kind"] == "none" and stats["accepted_drafts_hist"] == [stats["steps"]]
    assert stats["tau_tokens_per_step"] == 1.0
    # Where the start-up went, stage by stage up to the first token (the CLI runs in-process here: no imports).
    assert list(stats["startup_s"]) == ["imports", "tokenizer", "weights", "graphs", "prefill"]
    assert all(v >= 0 for v in stats["startup_s"].values())


def test_trace_file_has_one_line_per_step(gen, tmp_path):
    trace = tmp_path / "trace.jsonl"
    res = gen("-p", "hi", "-n", "6", "--json", "--trace", trace, *GREEDY)
    assert res.code == 0, res.err
    data = res.json()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == data["stats"]["steps"] + 1  # the first token (from the prefill) is step 0
    assert [line["step"] for line in lines] == list(range(len(lines)))
    assert all(set(line) == {"step", "draft", "accepted", "emitted"} for line in lines)
    assert all(line["draft"] == [] and line["accepted"] == 0 for line in lines)
    assert [t for line in lines for t in line["emitted"]] == data["tokens"]


def test_piped_stream_is_plain_text(gen):
    streamed = gen("-p", "hi", "-n", "12", *GREEDY)
    as_json = gen("-p", "hi", "-n", "12", "--json", *GREEDY)
    assert streamed.code == 0, streamed.err
    assert "\x1b" not in streamed.out and "tok/s" not in streamed.out  # no colours, no footer
    assert streamed.out == as_json.json()["text"] + "\n"


def test_on_a_terminal_a_chat_models_prompt_shows_as_a_quoted_line(gen, monkeypatch):
    """The tiny model has a chat template: its prompt is a question, shown as `> question` above the answer."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: a terminal
    res = gen("-p", "What is two\nplus two?", "-n", "3", *GREEDY)
    assert res.code == 0, res.err
    assert "\x1b[2m> What is two\x1b[0m\n\x1b[2m> plus two?\x1b[0m\n" in res.out


def test_prompt_longer_than_context_fails_before_loading(cli, tmp_path, no_weights):
    from tiny import make_qwen3

    small = make_qwen3(tmp_path / "small", max_position_embeddings=32)
    res = cli("generate", "--model", small, "--draft", "none", "-p", "word " * 50)
    assert_one_line_error(res, "prompt is", "context holds 32")


@pytest.mark.parametrize("flags,needle,code", [
    (["-p", "hi", "--temperature", "-0.5"], "--temperature", 1),
    (["-p", "hi", "--temperature", "nan"], "--temperature", 1),
    (["-p", "hi", "--top-p", "1.5"], "--top-p", 1),
    (["-p", "hi", "--top-p", "0"], "--top-p", 1),
    (["-p", "hi", "--top-k", "-1"], "--top-k", 1),
    (["-p", "hi", "--top-k", str(2**64)], "--top-k", 1),  # was torch's OverflowError
    (["-p", "hi", "--temperature", "1", "--seed", str(2**64)], "--seed", 1),  # was torch's OverflowError
    (["-p", "hi", "--max-tokens", "0"], "--max-tokens", 1),
    (["-p", "hi", "--max-tokens", "lots"], "--max-tokens", 2),
    (["--prompt-file", "missing.txt"], "missing.txt", 1),
    (["-p", "hi", "--prompt-file", "p.txt"], "not both", 1),
    ([], "no prompt", 1),
    (["-p", "hi", "--raw", "--system", "S"], "--raw", 1),
    (["-p", "", "--raw"], "empty", 1),
    (["-p", "hi", "--no-such-flag"], "--no-such-flag", 2),
])
def test_invalid_input_is_one_error_line_before_loading(gen, no_weights, flags, needle, code):
    res = gen(*flags)
    assert_one_line_error(res, needle, code=code)
    assert res.out == ""


def test_ctrl_c_stops_generation_with_exit_130(gen, monkeypatch):
    from dflash_cli.ui.stream import StreamView

    real, calls = StreamView.on_step, []

    def interrupt_on_second(self, step):
        calls.append(step)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(self, step)

    monkeypatch.setattr(StreamView, "on_step", interrupt_on_second)
    res = gen("-p", "hi", "-n", "50", "--temperature", "1", "--top-k", "50", "--seed", "1")
    assert len(calls) == 2, "the answer ended before the second step"
    assert res.code == 130 and res.err.strip() == "interrupted"


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """huggingface_hub reads HF_HOME once, at import: point its cache at this test's empty HF_HOME too."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setenv("COLUMNS", "250")


def test_models_lists_the_registry(cli, empty_hub_cache):
    """Piped: one tab-separated line per entry, nothing cut (before: `RedHatAI/Qwen3-4B-specula…`), descriptions
    included (before: left out)."""
    from dflash_cli.registry import Registry

    res = cli("models")
    assert res.code == 0, res.err
    assert "…" not in res.out
    lines = res.out.splitlines()
    assert lines[1].split("\t") == ["name", "description", "target", "downloaded", "drafters"]
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[2:]}
    reg = Registry.load()
    assert len(rows) == len(reg.entries) == len(lines) - 2
    name, description, target, downloaded, drafters = rows["demo (default)"]
    assert target == "pkg:demo/target" and downloaded.startswith("✓")  # shipped inside
    for name, e in reg.entries.items():
        row = rows[name + (" (default)" if name == reg.default else "")]
        assert row[1] == e.description and row[2] == e.target.name
        assert all(f"{kind}: {src.name} [" in row[4] for kind, src in e.drafters.items())
        if name != "demo":
            assert "✓" not in "".join(row)  # nothing from the Hub
    assert "dflash2: RedHatAI/Qwen3-4B-speculator.dflash2 [—]" in rows["qwen3-4b"][4]


@pytest.mark.parametrize("width", [80, 30])
def test_models_on_a_terminal_wraps_repo_ids_and_never_cuts_them(empty_hub_cache, width):
    import io

    from rich.console import Console

    from dflash_cli.commands.models import list_models
    from dflash_cli.registry import Registry

    console = Console(file=io.StringIO(), width=width, force_terminal=True, record=True)
    list_models(console)
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    refs = []  # the second column (from 11: "  dflash2" and 2 spaces), its folded pieces joined
    for line in text.splitlines():
        piece = line[11:].split("  ")[0].strip()
        if re.match(r"  [a-z]", line):
            refs.append(piece)
        elif line.startswith(" " * 11) and piece:
            refs[-1] += piece
    squeezed = "".join(text.split())
    for e in Registry.load().entries.values():
        assert "".join(e.description.split()) in squeezed
        assert all(src.name in refs for src in [e.target, *e.drafters.values()]), refs
    if width == 80:
        assert "  dflash2  RedHatAI/Qwen3-4B-speculator.dflash2  —" in text  # whole on one line where it fits


def test_empty_prompt_with_nothing_pending_is_a_clear_error(tiny_model):
    """The engine refuses an empty prompt (the CLI rejects it earlier: `-p "" --raw` above)."""
    from dflash_cli.runtime.generation import PlainDecoder, Request, generate
    from dflash_cli.runtime.sampling import SamplingParams
    from dflash_cli.runtime.session import Session
    from dflash_cli.errors import DflashError

    session = Session(Qwen3Model.load(tiny_model), 64)
    with pytest.raises(DflashError, match="the prompt is empty"):
        generate(session, PlainDecoder(), Request([], SamplingParams(), 4))
    assert session.length == 0 and session.pending == []
    first = generate(session, PlainDecoder(), Request([5, 6, 7], SamplingParams(), 2))
    # A pending token (the last answer token) is something to continue from.
    more = generate(session, PlainDecoder(), Request([], SamplingParams(), 2))
    assert len(more.tokens) == 2 and session.length == 3 + len(first.tokens) + 1


# Issue 43: input checks up front, honest statistics, --version, help texts, --context, --threads.

@pytest.mark.parametrize("flags,needle", [
    (["-p", ""], "the prompt is empty (--prompt)"),
    (["-p", "  \n\t "], "only whitespace (--prompt)"),
    (["--prompt-file", "blank.txt"], "only whitespace (prompt file"),
])
def test_empty_or_blank_prompts_from_any_source_are_an_error(gen, no_weights, flags, needle, tmp_path, monkeypatch):
    """Before: `--prompt ""` or a blank file generated 512 newlines and exited 0."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "blank.txt").write_text("\n  \n")
    res = gen(*flags)
    assert_one_line_error(res, needle)
    assert gen(stdin=" \n").err.strip() == "error: the prompt is only whitespace (stdin)"


def test_draft_len_above_the_drafters_maximum_is_an_error(cli):
    """Before: silently clamped to the drafter's maximum."""
    res = cli("generate", "-p", "def f():", "--draft", "dflash", "--draft-len", "40", "-n", "4")
    assert_one_line_error(res, "--draft-len 40", "at most 15")
    res = cli("generate", "-p", "def f():", "--draft", "dflash", "--draft-len", "15", "-n", "4", "--json")
    assert res.code == 0, res.err


def test_version_and_exit_codes(cli):
    from importlib.metadata import version

    res = cli("--version")
    assert res.code == 0 and res.out.strip() == f"dflash {version('dflash-cli')}"
    assert "130" in cli("--help").out and "2 usage" in cli("--help").out


def test_every_option_has_help_text():
    """Before: --prompt, --prompt-file, --system, --top-p, --top-k, --seed, bench's --max-tokens, --repeat had none."""
    import typer.main

    from dflash_cli.cli.app import app

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            if param.name != "help":
                assert getattr(param, "help", None), f"dflash {name}: {param.opts or param.name} has no help text"


def test_flags_are_declared_once():
    """Each command's flags are its options dataclass's fields: the command builds the options by keyword."""
    import dataclasses
    import inspect

    import typer.main

    from dflash_cli import options
    from dflash_cli.cli.app import app

    group = typer.main.get_command(app)
    for name, cls in [("generate", options.GenerateOptions), ("chat", options.ChatOptions),
                      ("bench", options.BenchOptions), ("train", options.TrainOptions)]:
        params = {p.name for p in group.commands[name].params} - {"help"}
        fields = {f.name for f in dataclasses.fields(cls)} - {"drafts", "seed"} | ({"seed"} if name != "bench" else set())
        assert params == fields, name
    app_source = inspect.getsource(__import__("dflash_cli.cli.app", fromlist=["x"]))
    assert "--prompt" not in app_source and "--max-tokens" not in app_source  # no second declaration


def test_stats_go_to_stderr_when_stdout_is_not_a_terminal(gen):
    """Before: with stdout redirected no statistics were shown anywhere."""
    res = gen("-p", "hi", "-n", "6", "--stats", *GREEDY)
    assert res.code == 0, res.err
    assert "tok/s" not in res.out and re.match(r"\d+ tok · [\d.]+ tok/s · first token \d+ ms", res.err)


def test_context_flag_and_a_full_context_finish_reason(gen, tok):
    """`generate --context`: a generation stopped by the context reports finish_reason "context"."""
    tok.stop_ids = []
    res = gen("-p", "hi", "-n", "200", "--context", "24", "--json", "--no-repeat-guard", *GREEDY)
    assert res.code == 0, res.err
    data = res.json()
    if data["finish_reason"] != "stop":
        assert data["finish_reason"] == "context" and data["prompt_tokens"] + len(data["tokens"]) <= 24
    assert_one_line_error(gen("-p", "hi", "--context", "8"), "--context must be between 16 and")


def test_repetition_guard_stops_a_loop_and_can_be_turned_off(gen, monkeypatch):
    from dflash_cli.commands import common

    monkeypatch.setattr(common.RepetitionGuard, "looping", lambda self, toks: len(toks) >= 5)
    res = gen("-p", "hi", "-n", "30", "--json", *GREEDY)
    data = res.json()
    assert res.code == 0 and (data["finish_reason"] == "repetition" and len(data["tokens"]) == 5
                              or data["finish_reason"] == "stop")
    res = gen("-p", "hi", "-n", "30", "--json", "--no-repeat-guard", *GREEDY)
    assert res.json()["finish_reason"] != "repetition"


def test_interrupted_generate_keeps_its_tok_s_and_says_interrupted(gen, monkeypatch):
    """Before: finish_reason "length" and 0.0 tok/s for an interrupted answer."""
    import time

    from dflash_cli.commands import generate as g

    calls = []

    def slow_then_ctrl_c(step):
        calls.append(step)
        time.sleep(0.01)
        if len(calls) == 6:
            raise KeyboardInterrupt

    real_tee = g.tee
    monkeypatch.setattr(g, "tee", lambda *fns: real_tee(*fns, slow_then_ctrl_c))
    res = gen("-p", "hi", "-n", "50", "--json", "--no-repeat-guard", "--temperature", "1", "--seed", "1")
    assert res.code == 130
    data = json.loads(res.out)
    assert data["finish_reason"] == "interrupted" and data["stats"]["decode_tok_per_s"] > 0


def test_threads_default_never_oversubscribes(monkeypatch, tmp_path):
    import torch

    from dflash_cli.commands import common

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    (tmp_path / "model.safetensors").write_bytes(b"0" * 1000)
    assert common.set_threads(None, tmp_path, "cpu") == 1  # a small model: one thread is fastest
    monkeypatch.setattr(common, "weights_bytes", lambda folder: 2**33)
    assert 1 <= common.set_threads(None, tmp_path, "cpu") == common.physical_cores() <= len(os.sched_getaffinity(0))
    monkeypatch.setattr(common, "available_cpus", lambda: 4)
    assert common.set_threads(3, tmp_path, "cpu") == 3
    assert common.set_threads(None, tmp_path, "cuda") is None


def test_more_threads_than_cpus_is_one_error_line(gen, monkeypatch):
    """Before: --threads 100000 crashed torch with a segmentation fault."""
    from dflash_cli.commands import common

    monkeypatch.setattr(common, "available_cpus", lambda: 2)
    assert_one_line_error(gen("-p", "hi", "--threads", "100000"), "--threads 100000", "2 CPUs")


def test_demo_completes_the_prompt_line_without_a_spurious_newline(cli):
    """Before: the demo's template appended a newline, so `def fibonacci(n):` got a new `def ...` after it."""
    from dflash_cli.loading.tokenizer import ChatTokenizer
    from dflash_cli.registry import Registry
    from dflash_cli.training.bpe import CHAT_TEMPLATE

    tok = ChatTokenizer(Registry.load().entries["demo"].target.path())
    assert tok.render_chat([{"role": "user", "content": "def fibonacci(n):"}]) == "def fibonacci(n):"
    assert tok.template_text == CHAT_TEMPLATE  # `dflash train` writes the same template
    res = cli("generate", "-p", "def fibonacci(n):", "-n", "24", "--json")
    data = res.json()
    assert res.code == 0 and not data["text"].lstrip().startswith("def ")


def test_undecodable_prompts_are_one_error_line(gen, no_weights):
    """Before: bytes that are not UTF-8 on stdin or in --prompt ended as 'error: TypeError: TextInputSequence must be str'."""
    assert_one_line_error(gen(stdin="x = '\udcff'\n"), "not valid UTF-8 (stdin")
    assert_one_line_error(gen("-p", "x = '\udcff'"), "not valid UTF-8 (--prompt")


def test_draft_kinds_take_any_case_and_an_unknown_draft_lists_them(cli, no_weights):
    """Before: `--draft EAGLE3` was looked up as a folder, and `--draft foo` said only 'no such model folder,
    registry entry or Hub repo id: foo'."""
    res = cli("generate", "-p", "def f():", "--draft", "foo", "-n", "2")
    assert_one_line_error(res, "unknown drafter 'foo'", "none, dflash, dflash2, eagle3, mtp", "owner/name")


def test_draft_kind_in_capitals_is_the_kind(cli):
    res = cli("generate", "-p", "def f():", "--draft", "EAGLE3", "-n", "4", "--json")
    assert res.code == 0, res.err
    assert res.json()["stats"]["draft_kind"] == "eagle3"
    plain = cli("generate", "-p", "def f():", "--draft", "None", "-n", "2", "--json")
    assert plain.code == 0 and plain.json()["stats"]["draft_kind"] == "none", plain.err


def test_a_reader_that_stops_early_ends_generate_quietly():
    """Before: `dflash generate ... | head -1` exited 1 without a word (typer's answer to a closed pipe)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    child = subprocess.Popen([sys.executable, "-m", "dflash_cli", "generate", "-p", "import os", "-n", "900",
                              "--no-repeat-guard", *GREEDY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout.readline()  # the first line, then the reader goes
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and err == "", err  # no traceback, no 'Exception ignored'


LICENCE = "# Licensed under the Apache License"


@pytest.mark.parametrize("draft", ["none", "dflash"])
def test_stop_ends_the_answer_before_its_text(cli, draft):
    """--stop: the answer is cut where the first stop text appears (not shown), whatever the speculative step wrote
    after it; in a pipe, in --json (text, tokens through the one that completed it, finish reason stop)."""
    args = ("generate", "--raw", "-p", LICENCE, "-n", "40", "--temperature", "0", "--draft", draft)
    full = cli(*args, "--json").json()
    assert "(the" in full["text"] and full["finish_reason"] == "length"
    cut = full["text"].index("(the")
    res = cli(*args, "--stop", "(the", "--stop", "never there")
    assert res.code == 0 and res.out == full["text"][:cut] + "\n", res.out
    got = cli(*args, "--stop", "(the", "--json").json()
    assert got["text"] == full["text"][:cut] and got["finish_reason"] == "stop"
    n = len(got["tokens"])
    assert got["tokens"] == full["tokens"][:n] and got["completion_tokens"] == n
    from dflash_cli.registry import Registry
    from dflash_cli.runtime.bundle import open_bundle

    tok = open_bundle(Registry.load().resolve("demo"), "cpu", None).tokenizer
    assert "(the" in tok.decode(got["tokens"]) and "(the" not in tok.decode(got["tokens"][:-1])
    nothing = cli(*args, "--stop", "never there", "--json").json()
    assert nothing["text"] == full["text"] and nothing["finish_reason"] == "length"


def test_stop_needs_a_text(cli):
    res = cli("generate", "--model", "demo", "-p", "x", "--stop", "")
    assert res.code == 1 and res.err.strip() == "error: --stop needs a text (got an empty one)"
