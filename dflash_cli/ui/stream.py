"""Showing a generation as it streams: finished lines as plain output, a live tail and statistics footer.

In a terminal every finished line is printed once, as normal output (the scrollback holds it exactly
once); only the unfinished last line and the footer are redrawn. Elsewhere (a pipe, a file) the text
goes to stdout as it comes and nothing else.
"""

from __future__ import annotations

import sys
import time

from rich.cells import cell_len
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ..runtime.stats import acceptance_stats
from ..loading.tokenizer import StreamDecoder

DRAFT_STYLE = "cyan"
BARS = " ▁▂▃▄▅▆▇█"
REFRESH_S = 1 / 10  # the live tail and footer are redrawn at most this often
ECHO_LINES = 8  # a long prompt's echo: the lines next to the answer, not screens of scrollback
ECHO_CHARS = 800  # the same for a prompt of a few very long lines (about 8 rows of 100 columns)
LEGEND = """\
footer: τ = tokens committed per target forward (accepted drafts + 1; plain decoding: 1.00)
        accepted drafts/step = histogram of the drafts each step accepted, 0 on the left
        accept % by draft position = how often the drafter's k-th token was accepted, k = 1, 2, …"""


class StreamView:
    """Receives decoder steps, prints their text, and keeps the footer current.

    Live mode when `console` is a terminal; otherwise raw text to stdout, nothing else,
    so `dflash generate ... > out.txt` is exactly the generated text.
    """

    def __init__(self, console: Console, tokenizer, stop_ids, show_drafts: bool = False, live: bool | None = None,
                 echo: Text | None = None, text=None):
        self.console = console
        # text: where the shown text comes from instead of decoding each step here: an object with take() (the text
        # new since the last call) and finish() (the rest at the end), fed the steps before this view (--stop's)
        self.text = text
        self.echo = echo  # shown before the answer in live mode (the prompt: `prompt_echo`)
        self.live_mode = console.is_terminal if live is None else live
        self.decoder = StreamDecoder(tokenizer)
        self.stop_ids = set(stop_ids)
        self.show_drafts = show_drafts
        self.tail = Text()  # the unfinished line (everything before it is printed)
        self.steps = []  # decode steps after the first token
        self.n_tokens = 0
        self.t0 = time.perf_counter()
        self.ttft = None
        self.t_last = None  # when the latest step arrived (the footer's rate stops there)
        self.finish_reason = None  # set by the caller when it knows why the answer ended
        self._live = None
        self._drawn = 0.0

    def __enter__(self):
        if self.live_mode:
            # transient: the footer is drawn once more, for good, in __exit__; the live region is
            # only ever the tail line and the footer, so it always fits the screen (crop if not).
            self._live = Live(console=self.console, auto_refresh=False, transient=True,
                              vertical_overflow="crop", get_renderable=self._render)
            self._live.__enter__()
            if self.echo is not None:
                self.tail.append_text(self.echo)
                if "\n" in self.tail.plain:
                    self._print_finished()
                self._print_overlong()
        return self

    def __exit__(self, *exc):
        self._emit(self.decoder.flush() if self.text is None else self.text.finish(), None)
        if self._live is not None:
            tail, self.tail = self.tail, Text()
            self._live.__exit__(*exc)
            if tail.plain:
                self.console.print(tail, soft_wrap=True)
            if self.n_tokens:  # the final footer stays, once, under the answer
                self.console.print(self.footer(final=True), style="dim", soft_wrap=False)
        elif self.n_tokens:
            sys.stdout.write("\n")
            sys.stdout.flush()
        return False

    def on_step(self, step) -> None:
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - self.t0
        else:
            self.steps.append(step)
        self.t_last = now
        self.n_tokens += len(step.emitted)
        visible = [t for t in step.emitted if t not in self.stop_ids]
        if self.text is not None:  # a whole piece, without the drafts' colour
            self._emit(self.text.take(), None)
            visible = []
        elif self.show_drafts and step.accepted:
            self._emit(self.decoder.push(visible[: step.accepted]), DRAFT_STYLE)
            visible = visible[step.accepted :]
        self._emit(self.decoder.push(visible), None)
        if self._live is not None and now - self._drawn >= REFRESH_S:
            self._drawn = now
            self._live.refresh()

    def _emit(self, piece: str, style) -> None:
        if not piece:
            return
        if self._live is not None:
            self.tail.append(piece, style=style)
            if "\n" in piece:
                self._print_finished()
            self._print_overlong()
        elif not self.live_mode:
            sys.stdout.write(piece)
            sys.stdout.flush()

    def _print_finished(self) -> None:
        """Print every finished line above the live region, once."""
        plain = self.tail.plain
        cut = plain.rfind("\n")
        done, self.tail = self.tail[:cut], self.tail[cut + 1 :]
        self.console.print(done, soft_wrap=True)  # the terminal wraps long lines; nothing is re-printed

    def _print_overlong(self) -> None:
        """An unfinished line taller than a few rows: print its full rows now (the live region must fit)."""
        width = max(self.console.width, 20)
        rows = max(1, self.console.height // 3)
        if cell_len(self.tail.plain) <= width * rows:
            return
        plain, cells, cut = self.tail.plain, 0, 0
        for i, ch in enumerate(plain):  # whole rows only, so the terminal shows the same breaks as soft wrapping
            cells += cell_len(ch)
            if cells > width * (rows - 1):
                break
            if cells % width == 0:
                cut = i + 1
        if cut:
            done, self.tail = self.tail[:cut], self.tail[cut:]
            self.console.print(done, soft_wrap=True)

    def elapsed_decode(self) -> float:
        if self.ttft is None or self.t_last is None:
            return 0.0
        return self.t_last - self.t0 - self.ttft

    def footer(self, final: bool = False) -> Text:
        """The footer, cut to the terminal: no line wider than it, and in a short terminal fewer lines (the
        live region must stay well inside the screen, or each redraw would leave a copy in the scrollback)."""
        width, height = max(self.console.width, 10), self.console.height
        lines = footer_lines(self.n_tokens, self.ttft, self.elapsed_decode(), self.steps, width, self.finish_reason)
        if not final:
            lines = lines[: max(1, height // 4)]
        text = Text()
        for i, line in enumerate(lines):
            piece = Text(line)
            piece.truncate(width, overflow="ellipsis")
            text.append_text(piece)
            if i < len(lines) - 1:
                text.append("\n")
        return text

    def _render(self):
        footer = self.footer()
        footer.stylize("dim")
        return Group(self.tail, footer) if self.tail.plain else footer


def prompt_echo(prompt: str, continues: bool) -> Text:
    """The prompt as the terminal shows it before the answer, dimmed. A text the model continues (a completion
    model's, --raw) shows as it is, the answer going on from its last character; a question to a chat model shows as
    quoted "> " lines, the answer below. A long prompt shows its last lines (those the answer continues) or, quoted,
    its first ones, with a line saying how many are left out."""
    lines = prompt.split("\n")
    cut = len(lines) - ECHO_LINES
    if continues:
        shown = "\n".join(lines[-ECHO_LINES:])
        shown = "…" + shown[-ECHO_CHARS:] if len(shown) > ECHO_CHARS else shown
        return Text((f"… ({cut} earlier lines of the prompt)\n" if cut > 0 else "") + shown, style="dim")
    shown = "\n".join(f"> {line}" for line in lines[:ECHO_LINES])
    shown = shown[:ECHO_CHARS] + "…" if len(shown) > ECHO_CHARS else shown
    return Text(shown + (f"\n> … ({cut} more lines)" if cut > 0 else "") + "\n", style="dim")


def footer_lines(n_tokens: int, ttft, decode_s: float, steps, width: int = 80, finish: str | None = None) -> list[str]:
    """The statistics footer, each line at most `width` cells: speed, then the drafter's acceptance (labelled)."""
    rate = (n_tokens - 1) / decode_s if n_tokens > 1 and decode_s > 0 else 0.0
    parts = [f"{n_tokens} tok", f"{rate:.1f} tok/s"]
    if ttft is not None:
        parts.append(f"first token {ttft * 1000:.0f} ms")
    spec = steps and any(s.draft for s in steps)
    if spec:
        st = acceptance_stats(steps)  # no step times: reading them mid-generation would wait for the device
        parts.append(f"τ {st['mean_accepted']:.2f} tok/step")
    if finish and finish not in ("stop", "length"):
        parts.append(f"[{finish}]")
    lines = _pack(parts, width)
    if spec:
        hist = st["accept_hist"]
        by_pos = " ".join(f"{p * 100:.0f}" for p in st["accept_by_position"])
        pos = f"accept % by draft position 1–{len(st['accept_by_position'])}: {by_pos}"
        lines += _pack([f"accepted drafts/step 0–{len(hist) - 1}: {histogram(hist)}",
                        pos if cell_len(pos) <= width else f"pos %: {by_pos}"], width)
    return lines


def _pack(parts: list[str], width: int) -> list[str]:
    """Parts joined by ' · ', as many per line as fit in `width`."""
    lines: list[str] = []
    for part in parts:
        if lines and cell_len(lines[-1] + " · " + part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def footer_line(n_tokens: int, ttft, t0: float, steps) -> str:
    """One-line form of the footer (tok/s measured up to now)."""
    decode = time.perf_counter() - t0 - (ttft or 0)
    return " · ".join(footer_lines(n_tokens, ttft, decode, steps, width=10_000))


def histogram(counts: list[int]) -> str:
    """A one-line bar chart of accepted-length counts (index = accepted drafts)."""
    top = max(counts) if counts else 0
    if not top:
        return ""
    return "".join(BARS[round(c / top * (len(BARS) - 1))] for c in counts)


# What the engine's statistics are called in --json output: each name says what it holds.
JSON_NAMES = {
    "mean_accepted": "tau_tokens_per_step",  # tokens committed per decode step (accepted drafts + 1)
    "accept_hist": "accepted_drafts_hist",  # [i] = steps that accepted i drafts
    "accept_by_position": "accept_rate_by_position",  # [k] = share of steps whose (k+1)-th draft was accepted
}


def json_stats(stats: dict) -> dict:
    return {JSON_NAMES.get(k, k): v for k, v in stats.items()}
