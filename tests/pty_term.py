"""Drive the real `dflash` CLI in a pseudo-terminal (pexpect) and read what a terminal would show (pyte):
the screen and the scrollback above it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pexpect
import pyte

ROOT = Path(__file__).resolve().parent.parent
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # bracketed paste, as a terminal sends a paste


class Term:
    def __init__(self, args, home: Path, cols: int = 80, rows: int = 24, env: dict | None = None):
        self.cols, self.rows = cols, rows
        self.screen = pyte.HistoryScreen(cols, rows, history=100_000, ratio=0.001)
        self.screen.set_mode(pyte.modes.LNM)  # a newline also returns the carriage (what a tty's onlcr gives us)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""
        child_env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        child_env.update(PYTHONPATH=str(ROOT), TERM="xterm-256color", HOME=str(home), XDG_DATA_HOME=str(home / "data"),
                         HF_HUB_OFFLINE="1", PROMPT_TOOLKIT_NO_CPR="1", **(env or {}))
        self.child = pexpect.spawn(sys.executable, ["-m", "dflash_cli", *map(str, args)], env=child_env,
                                   dimensions=(rows, cols), cwd=str(ROOT))

    def pump(self, wait: float = 0.05) -> bool:
        """Read what the program wrote so far; False once it has exited and everything is read."""
        try:
            data = self.child.read_nonblocking(65536, timeout=wait)
        except pexpect.TIMEOUT:
            return True
        except pexpect.EOF:
            return False
        self.raw += data
        self.stream.feed(data)
        return True

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            alive = self.pump()
            if predicate(self):
                return
            if not alive:
                break
        raise AssertionError(f"timed out waiting for {what or predicate}; screen:\n" + "\n".join(self.lines()[-30:]))

    def wait_text(self, text: str, timeout: float = 60.0) -> None:
        self.wait_for(lambda t: text in t.text(), timeout, repr(text))

    def wait_exit(self, timeout: float = 60.0) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.pump():
            pass
        if self.child.isalive():
            self.child.wait() if time.monotonic() < end else self.child.terminate(force=True)
        self.child.close()
        if self.child.signalstatus is not None:
            return 128 + self.child.signalstatus
        return self.child.exitstatus

    def send(self, text: str) -> None:
        self.child.send(text)

    def paste(self, text: str) -> None:
        self.child.send(PASTE_START + text + PASTE_END)

    @staticmethod
    def _row(line, cols: int) -> str:
        return "".join(line[x].data for x in range(cols)).rstrip()

    def lines(self) -> list[str]:
        """Scrollback (oldest first) then the screen, trailing blank rows dropped."""
        rows = [self._row(line, self.cols) for line in self.screen.history.top]
        rows += [self._row(self.screen.buffer[y], self.cols) for y in range(self.rows)]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def text(self) -> str:
        return "\n".join(self.lines())

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
