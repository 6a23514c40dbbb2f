"""Regenerate docs/terminal.svg: a real `dflash generate` on the demo, rendered by Rich at 80 columns."""

import shlex
import sys
from pathlib import Path

from rich.console import Console

from dflash_cli.commands.generate import run_generate
from dflash_cli.cli.options import GenerateOptions
from dflash_cli.ui.stream import StreamView


class _NoLive:  # what stays on the terminal, without the intermediate redraws of the live footer
    def refresh(self):
        pass

    def __exit__(self, *exc):
        pass


StreamView.__enter__ = lambda self: (setattr(self, "_live", _NoLive()), self)[1]

console = Console(record=True, width=80, force_terminal=True, color_system="truecolor", file=open("/dev/null", "w"))
prompt = sys.argv[1] if len(sys.argv) > 1 else "# Licensed under the Apache License"
console.print(f"$ dflash generate --show-drafts -n 100 -p {shlex.quote(prompt)}", style="bold")
console.print(prompt, end="")
run_generate(GenerateOptions(prompt=prompt, max_tokens=100, show_drafts=True), console)
out = Path(__file__).with_name("terminal.svg")
console.save_svg(str(out), title="dflash generate")
print(f"wrote {out}")
