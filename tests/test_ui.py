"""The streaming view's pieces: a labelled footer that fits 80 columns with every draft position, the names
--json uses, the repetition guard, and the prompt's echo."""

import io

import pytest

from rich.cells import cell_len
from rich.console import Console

from dflash_cli.commands.common import RepetitionGuard, RepetitionStop, finish_reason
from dflash_cli.runtime.generation import Result, Step
from dflash_cli.ui.stream import LEGEND, StreamView, footer_lines, json_stats


def steps(accepted, drafts=15):
    return [Step(emitted=[1] * (a + 1), draft=[2] * drafts, accepted=a) for a in accepted]


def test_footer_is_labelled_fits_80_columns_and_shows_every_position():
    """Before: `τ 2.31 · accepted ▂█ · by pos 79 47 39 ...` on one line: unlabelled, 8 of 15 positions, wrapped."""
    lines = footer_lines(300, 0.012, 2.5, steps([15, 15, 1, 3, 15, 7] * 10), width=80)
    assert all(cell_len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "tok/step" in text and "accepted drafts/step 0–15:" in text
    positions = text.split("accept % by draft position 1–15:")[1].split()
    assert len(positions) == 15 and positions[0] == "100"
    assert "τ" in LEGEND and "pos" in LEGEND
    worst = footer_lines(100_000, 12.345, 2.5, steps([15] * 10), width=80, finish="interrupted")
    assert all(cell_len(line) <= 80 for line in worst) and worst[-1].split()[-15:] == ["100"] * 15


def test_plain_decoding_footer_is_one_line():
    lines = footer_lines(10, 0.01, 0.1, [Step(emitted=[1])] * 9, width=80)
    assert lines == ["10 tok · 90.0 tok/s · first token 10 ms"]


def test_footer_names_an_unusual_end():
    assert footer_lines(5, 0.01, 0.1, [], 80, "interrupted")[0].endswith("· [interrupted]")


def test_json_names_say_what_they_hold():
    """Before: `mean_accepted` held τ (tokens per step) and `accept_hist` counted accepted drafts."""
    named = json_stats({"mean_accepted": 2.5, "accept_hist": [1, 2], "accept_by_position": [0.5], "steps": 3})
    assert named == {"tau_tokens_per_step": 2.5, "accepted_drafts_hist": [1, 2], "accept_rate_by_position": [0.5],
                     "steps": 3}


def test_repetition_guard_stops_loops_only():
    g = RepetitionGuard()
    code = list(range(200))  # nothing repeats
    assert not g.looping(code)
    assert not g.looping([7] * 20)  # a short run passes (e.g. a row of '=')
    line = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    assert not g.looping(code + line * 2)
    assert g.looping(code + line * 3)
    try:
        for _ in range(5):
            g.on_step(Step(emitted=line))
        raise AssertionError("the guard did not trip")
    except RepetitionStop:
        assert g.tripped
    off = RepetitionGuard(enabled=False)
    for _ in range(10):
        off.on_step(Step(emitted=line))
    assert not off.tripped


def test_finish_reasons():
    r = Result(tokens=[1], finish_reason="length", prompt_tokens=1, ttft_s=0, decode_s=0, steps=[])
    assert finish_reason(r) == "length"
    r.context_full = True
    assert finish_reason(r) == "context"
    r.interrupted = True
    assert finish_reason(r) == "interrupted"
    g = RepetitionGuard()
    g.tripped = True
    assert finish_reason(r, g) == "repetition"


class FakeTok:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def test_stream_view_prints_each_finished_line_once_and_keeps_only_the_tail_live(monkeypatch):
    from dflash_cli.ui import stream

    monkeypatch.setattr(stream, "StreamDecoder", lambda tok: type("D", (), {
        "push": lambda self, ids: "".join(chr(i) for i in ids), "flush": lambda self: ""})())
    out = io.StringIO()
    console = Console(file=out, width=40, height=10, force_terminal=True, color_system=None)
    text = "".join(f"line {i}\n" for i in range(30)) + "tail"
    with StreamView(console, FakeTok(), [], live=True) as view:
        for ch in text:
            view.on_step(Step(emitted=[ord(ch)]))
            assert "\n" not in view.tail.plain and cell_len(view.tail.plain) <= 40 * 4
    # what stays on a terminal: the live region is erased and redrawn; count the lines printed for good
    printed = out.getvalue()
    for i in range(30):
        assert printed.count(f"line {i}\r\n") + printed.count(f"line {i}\n") >= 1
    assert "tail" in printed


def test_the_prompt_echo_is_dim_text_the_answer_continues_or_a_quoted_question():
    from dflash_cli.ui.stream import ECHO_LINES, prompt_echo

    echo = prompt_echo("def fibonacci(n):", continues=True)
    assert echo.plain == "def fibonacci(n):" and echo.style == "dim"  # the answer goes on from the colon
    assert prompt_echo("What is τ?\nBriefly.", continues=False).plain == "> What is τ?\n> Briefly.\n"
    long = "\n".join(f"line {i}" for i in range(20))
    assert prompt_echo(long, continues=True).plain.split("\n") == (
        [f"… ({20 - ECHO_LINES} earlier lines of the prompt)"] + [f"line {i}" for i in range(20 - ECHO_LINES, 20)])
    assert prompt_echo(long, continues=False).plain.split("\n")[-3:] == [f"> line {ECHO_LINES - 1}",
                                                                         f"> … ({20 - ECHO_LINES} more lines)", ""]
    assert len(prompt_echo("x" * 100_000, continues=True).plain) < 1000  # one huge line: its end only


def test_stream_view_shows_the_echo_before_the_answer_on_a_terminal_only(monkeypatch, capsys):
    """Before: generate showed no prompt, so `def fibonacci(n):` came out as a blank line then `    \"\"\"`."""
    pyte = pytest.importorskip("pyte")
    from dflash_cli.ui import stream
    from dflash_cli.ui.stream import prompt_echo

    monkeypatch.setattr(stream, "StreamDecoder", lambda tok: type("D", (), {
        "push": lambda self, ids: "".join(chr(i) for i in ids), "flush": lambda self: ""})())

    def shown(live: bool) -> str:
        out = io.StringIO()
        console = Console(file=out, width=40, height=10, force_terminal=live, color_system="standard" if live else None)
        with StreamView(console, FakeTok(), [], live=live, echo=prompt_echo("def f(n):", True)) as view:
            for ch in '\n    """Doc."""':
                view.on_step(Step(emitted=[ord(ch)]))
        return out.getvalue() + capsys.readouterr().out

    screen = pyte.Screen(40, 10)
    screen.set_mode(pyte.modes.LNM)
    pyte.Stream(screen).feed(shown(True))
    assert screen.display[:2] == ["def f(n):".ljust(40), '    """Doc."""'.ljust(40)]
    assert "\x1b[2mdef f(n):" in shown(True)  # dimmed
    assert shown(False) == '\n    """Doc."""\n'  # a pipe gets the answer only
