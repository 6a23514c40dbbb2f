"""A transient status line on the terminal while a command loads (torch, the tokenizer, the weights): on stderr,
so that stdout keeps only the command's output, and gone before that output starts."""

from __future__ import annotations

import contextlib

from rich.console import Console


@contextlib.contextmanager
def loading(what: str):
    """Shows "loading WHAT…" with a spinner while the block runs (on a terminal; elsewhere nothing). Yields the live
    display, whose stop() takes the line away early (before the first output), or None."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    from rich.live import Live
    from rich.spinner import Spinner

    # stderr printed meanwhile (warnings, the first-run notice) goes above the line; stdout is left alone.
    with Live(Spinner("dots", f"loading {what}…"), console=console, transient=True, redirect_stdout=False,
              refresh_per_second=12.5) as live:
        yield live
