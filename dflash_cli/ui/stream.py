"""Showing a generation as it streams: Rich text with a live statistics footer, or plain text."""

from __future__ import annotations

import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ..runtime.stats import acceptance_stats
from ..loading.tokenizer import StreamDecoder

DRAFT_STYLE = "cyan"
BARS = " ▁▂▃▄▅▆▇█"


class StreamView:
    """Receives decoder steps, prints their text, and keeps the footer current.

    Rich mode when `console` is a terminal; otherwise raw text to stdout, nothing else,
    so `dflash generate ... > out.txt` is exactly the generated text.
    """

    def __init__(self, console: Console, tokenizer, stop_ids, show_drafts: bool = False, live: bool | None = None):
        self.console = console
        self.live_mode = console.is_terminal if live is None else live
        self.decoder = StreamDecoder(tokenizer)
        self.stop_ids = set(stop_ids)
        self.show_drafts = show_drafts
        self.text = Text()
        self.steps = []  # decode steps after the first token
        self.n_tokens = 0
        self.t0 = time.perf_counter()
        self.ttft = None
        self._live = None

    def __enter__(self):
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=8, vertical_overflow="visible",
                              get_renderable=self._render)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        tail = self.decoder.flush()
        self._emit(tail, None)
        if self._live is not None:
            self._live.__exit__(*exc)
        elif self.n_tokens:
            sys.stdout.write("\n")
            sys.stdout.flush()
        return False

    def on_step(self, step) -> None:
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.t0
        else:
            self.steps.append(step)
        self.n_tokens += len(step.emitted)
        visible = [t for t in step.emitted if t not in self.stop_ids]
        if self.show_drafts and step.accepted:
            self._emit(self.decoder.push(visible[: step.accepted]), DRAFT_STYLE)
            visible = visible[step.accepted :]
        self._emit(self.decoder.push(visible), None)

    def _emit(self, piece: str, style) -> None:
        if not piece:
            return
        if self._live is not None:
            self.text.append(piece, style=style)
        elif not self.live_mode:
            sys.stdout.write(piece)
            sys.stdout.flush()

    def _render(self):
        return Group(self.text, Text(footer_line(self.n_tokens, self.ttft, self.t0, self.steps), style="dim"))


def footer_line(n_tokens: int, ttft, t0: float, steps) -> str:
    elapsed = time.perf_counter() - t0
    decode_time = elapsed - (ttft or 0)
    rate = (n_tokens - 1) / decode_time if n_tokens > 1 and decode_time > 0 else 0.0
    parts = [f"{n_tokens} tok", f"{rate:.1f} tok/s"]
    if ttft is not None:
        parts.append(f"ttft {ttft * 1000:.0f} ms")
    if steps and any(s.draft for s in steps):
        st = acceptance_stats(steps)  # no step times: reading them mid-generation would wait for the device
        parts.append(f"τ {st['mean_accepted']:.2f}")
        parts.append("accepted " + histogram(st["accept_hist"]))
        parts.append("by pos " + " ".join(f"{p * 100:.0f}" for p in st["accept_by_position"][:8]))
    return " · ".join(parts)


def histogram(counts: list[int]) -> str:
    """A one-line bar chart of accepted-length counts (index = accepted drafts)."""
    top = max(counts) if counts else 0
    if not top:
        return ""
    return "".join(BARS[round(c / top * (len(BARS) - 1))] for c in counts)
