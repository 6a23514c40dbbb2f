"""Regenerate docs/terminal.svg: a real `dflash generate` on the demo, rendered by Rich at 80 columns: the prompt
echoed dimmed, the answer after it, the footer. Shown as it stays on the terminal, without the live footer's
intermediate redraws."""

import shlex
import sys
from pathlib import Path

from rich.console import Console

from dflash_cli.commands.generate import run_generate
from dflash_cli.options import GenerateOptions
from dflash_cli.ui import stream


class _NoLive:  # the live region's redraws leave nothing on the terminal: skip them, keep everything printed for good
    def __init__(self, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def refresh(self):
        pass


stream.Live = _NoLive

console = Console(record=True, width=80, force_terminal=True, color_system="truecolor", file=open("/dev/null", "w"))
prompt = sys.argv[1] if len(sys.argv) > 1 else "# Licensed under the Apache License"
console.print(f"$ dflash generate --show-drafts -n 100 -p {shlex.quote(prompt)}", style="bold")
run_generate(GenerateOptions(prompt=prompt, max_tokens=100, show_drafts=True), console)
out = Path(__file__).with_name("terminal.svg")
console.save_svg(str(out), title="dflash generate")
print(f"wrote {out}")
