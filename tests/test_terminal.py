"""The terminal experience, driven through the real CLI in a pseudo-terminal (80×24) on the embedded demo:
streaming that leaves each line once in the scrollback, chat input (paste, multi-line, history, Ctrl-C/Ctrl-D),
Ctrl-C in bench and generate, and a chat that keeps answering once its context is full."""

import json
import re
import time

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("pyte")

from pty_term import Term  # noqa: E402

DEMO = ("--draft", "none", "--temperature", "0")


@pytest.fixture
def term(tmp_path):
    terms = []

    def start(*args, cols=80, rows=24, **kw):
        t = Term(args, tmp_path, cols=cols, rows=rows, **kw)
        terms.append(t)
        return t

    yield start
    for t in terms:
        t.close()


FOOTER = re.compile(r"^\d+ tok · [\d.]+ tok/s", re.M)


def answered(n: int):
    """Waits for the n-th answer's final footer and the prompt after it."""
    return lambda t: len(FOOTER.findall(t.text())) >= n and t.lines()[-1].startswith(">>>")


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("draft,cols,rows", [("none", 80, 24), ("dflash", 80, 24), ("dflash", 36, 7)])
def test_long_answer_leaves_each_line_once_in_the_scrollback(cli, term, draft, cols, rows):
    """Before: the live view re-drew the whole answer, so every refresh of an answer taller than the terminal
    pushed another partial copy into the scrollback (`generate -n 300` in 24 rows: the first line 4 times)."""
    args = ("generate", "-p", "import os", "-n", "300", "--draft", draft, "--no-repeat-guard")
    expected = cli(*args, "--json").json()
    assert len(expected["tokens"]) == 300 and expected["text"].count("\n") > 24  # taller than the terminal
    t = term(*args, cols=cols, rows=rows)
    assert t.wait_exit(120) == 0
    lines = t.lines()
    footer = [i for i, line in enumerate(lines) if re.match(r"\d+ tok · [\d.]+ tok/s", line)]
    assert len(footer) == 1, "\n".join(lines)  # the footer, once, after the answer
    body = "\n".join(lines[: footer[0]])
    assert squeeze(body) == squeeze("import os" + expected["text"])  # the prompt, then every line once
    assert all(len(line) <= cols for line in lines)
    if draft == "dflash" and cols == 80:
        assert lines[footer[0] + 1].startswith("accepted drafts/step 0–15:")
        assert "accept % by draft position 1–15:" in "\n".join(lines[footer[0] + 1:])


def test_generate_shows_loading_then_the_prompt_dimmed_and_the_answer_after_it(cli, term):
    """Before: nothing for the seconds of start-up, then an answer that began mid-line (`def fibonacci(n):` showed as
    a blank line and `    \"\"\"`): the prompt was not echoed."""
    args = ("generate", "-p", "def fibonacci(n):", "-n", "30", *DEMO)
    expected = cli(*args, "--json").json()["text"]
    t = term(*args)
    assert t.wait_exit(120) == 0
    raw = t.raw.decode("utf-8", "replace")
    assert "loading demo…" in raw and "loading" not in t.text()  # a status while it loads, gone before the answer
    assert raw.index("loading demo…") < raw.index("\x1b[2mdef fibonacci(n):")  # the prompt, dimmed
    first = ("def fibonacci(n):" + expected).split("\n")[:3]
    assert t.lines()[:3] == [line.rstrip() for line in first]


def test_chat_long_answers_are_not_duplicated(term):
    t = term("chat", *DEMO, "--max-tokens", "200", "--no-repeat-guard")
    t.wait_text(">>>")
    for prompt in ("import os", "class Stack:"):
        t.send(prompt + "\r")
        t.wait_for(answered(1 if prompt == "import os" else 2), 60, "the answer")
    t.send("\x04")
    assert t.wait_exit(30) == 0
    text = t.text()
    # each answer's first line shows once (before: every refresh of a tall answer copied it again)
    assert text.count('.path.join(path, "dir")') == 1, text
    # Ctrl-D: the shell's prompt starts on a fresh line below the >>> line (before: on the >>> line)
    cursor = t.screen.cursor
    assert text.rstrip().endswith(">>>") and cursor.x == 0 and Term._row(t.screen.buffer[cursor.y], 80) == ""


def test_pasted_lines_are_one_turn_and_triple_quotes_too(term):
    t = term("chat", *DEMO, "--max-tokens", "8")
    t.wait_text(">>>")
    t.paste("class A:\n    x = 1\n    y = 2")
    t.send("\r")
    t.wait_for(answered(1), 60, "the answer")
    t.send('"""\r')
    t.send("def f():\r")
    t.send('    return 1"""\r')
    t.wait_for(answered(2), 60, "the second answer")
    t.send("/stats\r")
    t.wait_text("turns")
    assert re.search(r"· 2 turns", t.text()), t.text()
    t.send("/exit\r")
    assert t.wait_exit(30) == 0


def test_chat_history_help_set_and_ctrl_c_at_the_prompt(term, tmp_path):
    t = term("chat", *DEMO, "--max-tokens", "4")
    t.wait_text(">>>")
    t.send("/help\r")
    t.wait_text("/set NAME VALUE")
    t.send("/set temperature 0.7\r")
    t.wait_text("temperature 0.7")
    t.send("some half-typed words\x03")  # Ctrl-C clears the line, the chat goes on
    t.send("/stats\r")
    t.wait_text("0 turns")
    t.send("/think on\r")
    t.wait_text("no thinking mode")
    t.send("\x04")
    assert t.wait_exit(30) == 0
    assert "unknown command" not in t.text()
    history = (tmp_path / "data" / "dflash" / "chat_history").read_text()
    assert "/set temperature 0.7" in history
    # history across runs: Up recalls the last entry of the previous run
    t2 = term("chat", *DEMO, "--max-tokens", "4")
    t2.wait_text(">>>")
    t2.send("\x1b[A")
    t2.wait_text(">>> /think on")
    t2.send("\x03\x04")
    assert t2.wait_exit(30) == 0


def test_ctrl_c_stops_bench_at_once_with_exit_130(term, tmp_path):
    """Before: 13 presses of Ctrl-C did not stop `dflash bench`; it exited 0 with the cut-short runs in its table."""
    out = tmp_path / "bench.json"
    t = term("bench", "--draft", "dflash", "-n", "200", "--repeat", "50", "--json", out)
    t.wait_for(lambda t: "warm-up" in t.text() or re.search(r"none: \d", t.text()), 120, "the bench running")
    time.sleep(0.5)
    t.send("\x03")
    start = time.monotonic()
    code = t.wait_exit(30)
    took = time.monotonic() - start
    assert code == 130 and took < 2.0, (code, took)
    assert "interrupted" in t.text() and "dflash bench" not in t.text()  # no table of cut-short runs
    assert not out.exists()


def test_interrupted_generate_json_is_honest(term, tmp_path):
    """Before: an interrupted answer reported 0.0 tok/s and finish_reason "length"."""
    trace = tmp_path / "trace.jsonl"
    t = term("generate", "-p", "import os", "-n", "1000", "--json", "--no-repeat-guard", "--trace", trace, *DEMO)
    # Ctrl-C once the model is generating (the trace gets a line per step)
    t.wait_for(lambda t: trace.exists() and trace.read_text().count("\n") >= 20, 120, "20 decoding steps")
    t.send("\x03")
    assert t.wait_exit(30) == 130
    raw = t.raw.decode("utf-8", "replace")
    data = json.loads(raw[raw.index("{"): raw.rindex("}") + 1])
    assert data["finish_reason"] == "interrupted"
    assert 20 <= len(data["tokens"]) < 1000 and data["stats"]["decode_tok_per_s"] > 0


def test_chat_keeps_answering_after_the_context_fills(term):
    """Before: once the context was full every turn was refused until /clear."""
    t = term("chat", *DEMO, "--context", "96", "--max-tokens", "40", "--no-repeat-guard")
    t.wait_text(">>>")
    for i in range(5):
        t.send(f"def function_{i}(x):\r")
        t.wait_for(answered(i + 1), 60, f"answer {i + 1}")
    assert "dropped the oldest" in t.text() and "/clear" not in t.text()
    t.send("/exit\r")
    assert t.wait_exit(30) == 0


def test_ctrl_c_stops_a_chat_answer_and_the_chat_goes_on(term):
    t = term("chat", *DEMO, "--max-tokens", "900", "--no-repeat-guard")
    t.wait_text(">>>")
    t.send("import os\r")
    t.wait_for(lambda t: re.search(r"^[1-9]\d+ tok · ", t.text(), re.M), 60, "the answer streaming")
    t.send("\x03")
    t.wait_for(lambda t: "[stopped]" in t.text() and t.lines()[-1].startswith(">>>"), 30, "[stopped] and a prompt")
    assert "[interrupted]" in t.text()  # the footer says why the answer ended
    t.send("/stats\r")
    t.wait_text("finish interrupted")
    rate = float(re.search(r"last answer: \d+ tok · ([\d.]+) tok/s", t.text()).group(1))
    assert rate > 0
    t.send("\x04")
    assert t.wait_exit(30) == 0


def test_generate_stop_on_a_terminal_shows_the_answer_up_to_its_text(cli, term):
    args = ("generate", "--raw", "-p", "# Licensed under the Apache License", "-n", "60", *DEMO)
    full = cli(*args, "--json").json()["text"]
    stop = "You may"
    assert stop in full
    t = term(*args, "--stop", stop)
    assert t.wait_exit(120) == 0
    text = t.text()
    assert stop not in text and full[: full.index(stop)].strip().splitlines()[-1].strip() in text, text
    assert FOOTER.search(text), text
