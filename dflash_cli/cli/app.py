"""The `dflash` command line: each command parses its flags and calls one function."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Optional

import typer
from rich.console import Console

from .. import tuning
from ..errors import DflashError, Interrupted
from ..options import BenchOptions, ChatOptions, GenerateOptions, ServeOptions, TrainOptions, command

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)

class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich's own answer to a reader that stopped early is exit 1, out of the middle of the command: raise, so that
        the command ends as a print() to a closed pipe does (_quiet_on_closed_pipe: exit 0)."""
        self.quiet = True
        raise BrokenPipeError


def _console(min_width: int | None = None) -> Console:
    console = _Console(highlight=False)
    if min_width and not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = max(console.width, min_width)  # a table saved to a file should not wrap its columns
    return console


def _version(value: bool) -> None:
    if value:
        try:
            from importlib.metadata import version

            ours = version("dflash-cli")
        except Exception:
            ours = "unknown"
        print(f"dflash {ours}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                        help="Print the version and exit.")):
    """Local LLM inference with speculative decoding (DFlash, DFlash 2, EAGLE-3, MTP).

    Exit codes: 0 success, 1 error, 2 usage error (bad flag or value), 130 interrupted (Ctrl-C)."""


# Each command's flags are its options dataclass's fields (options.py): declared once. generate and chat start
# in commands/start.py, which checks their input before torch is imported.
app.command("generate")(command(GenerateOptions, "dflash_cli.commands.start:generate", _console))
app.command("chat")(command(ChatOptions, "dflash_cli.commands.start:chat", _console))


@app.command()
def models():
    """List registry entries and what is downloaded."""
    from ..commands.models import list_models

    list_models(_console())


@app.command()
def pull(
    model: Optional[str] = typer.Argument(None, help="Registry name or Hub repo id (default: the registry's default)."),
    drafters: bool = typer.Option(True, "--drafters/--no-drafters", help="Also download the drafters."),
):
    """Download a model and its drafters (resumes interrupted downloads)."""
    from ..commands.models import pull as do_pull

    do_pull(model, drafters, _console())


app.command("bench")(command(BenchOptions, "dflash_cli.commands.bench:run_bench", lambda: _console(min_width=160)))
app.command("train")(command(TrainOptions, "dflash_cli.commands.train:run_train", _console))


app.command("serve")(command(ServeOptions, "dflash_cli.commands.serve:run_serve", _console))


def _quiet_on_closed_pipe(fn):
    """A reader that stops early (`dflash generate ... | head -1`) ends the command quietly with exit 0, as git and
    ripgrep do: the reader had what it wanted, and `set -o pipefail` scripts should not fail for it. Caught here,
    inside the command, because typer would turn it into a silent exit 1."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            _drop_stdout()

    return run


def _drop_stdout() -> None:
    """stdout's reader is gone: point it at devnull (Python's advice), so the flush at exit meets no second
    BrokenPipeError (an 'Exception ignored' line on stderr)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


for _info in app.registered_commands:
    _info.callback = _quiet_on_closed_pipe(_info.callback)


def main() -> None:
    """Entry point: user-facing errors become one line on stderr and exit 1; Ctrl-C exits 130; a closed stdout
    (the reader stopped early) exits 0 without a word."""
    # torch warns at import where NumPy is not installed (the CPU wheel does not require it); nothing here uses NumPy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        tuning.configure()  # the knobs, read once for this command
        code = app(standalone_mode=False)
        sys.stdout.flush()  # here, not at exit, so that a reader gone by now is a closed pipe like any other
    except BrokenPipeError:
        _drop_stdout()
        code = 0
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
    except Interrupted as exc:
        print(exc, file=sys.stderr)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors and anything unforeseen: still one line
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # click usage errors (typer may vendor click)
            if exc.format_message():
                print(f"error: {exc.format_message()}", file=sys.stderr)
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        if tuning.KNOBS.debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (set DFLASH_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(1)
    # Without standalone mode typer returns, not raises, the exit code of a Ctrl-C (130) or typer.Exit.
    if isinstance(code, int) and code:
        if code == 130:
            print("\ninterrupted", file=sys.stderr)
        sys.exit(code)
