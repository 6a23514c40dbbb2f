"""When a training run stops at its next resumable point: a time limit, or a Ctrl-C.

Python runs a signal handler between bytecodes only, and a training step spends most of its time inside single torch
calls (a demo step's backward on a CPU: tens of seconds): a handler alone would answer a Ctrl-C a step late, and two
presses in one call would count as one. The interpreter's C-level handler also writes each signal to a wakeup fd at
once: a thread reading it says at once that the run stops after this step, and on a second Ctrl-C ends the process."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable

INTERRUPTED = 130  # the exit status of a command Ctrl-C ended (128 + SIGINT)


class Stop:
    """Due after a step once `time_limit` seconds have passed (so every run makes progress), or after a first Ctrl-C
    while `on_ctrl_c` is in force; `interrupted` (a Ctrl-C) also stops a stage before its first step."""

    def __init__(self, time_limit: float | None = None):
        self.deadline = None if time_limit is None else time.monotonic() + time_limit
        self.interrupted = False

    def __call__(self) -> bool:
        return self.interrupted or (self.deadline is not None and time.monotonic() > self.deadline)

    @property
    def reason(self) -> str:
        return "Ctrl-C" if self.interrupted else "time limit"

    @contextmanager
    def on_ctrl_c(self, note: Callable[[str], None]):
        """Within: a first Ctrl-C sets `interrupted` and says so; a second one ends the process at once (exit status
        130; the last checkpoint stays). Off the main thread (no signal handlers there) Ctrl-C is as usual."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        read, write = os.pipe()
        os.set_blocking(write, False)  # the C handler must never block

        def handler(signum, frame):
            self.interrupted = True  # at the loop's next check, whether or not the watcher has run yet

        before = signal.signal(signal.SIGINT, handler)
        before_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        watcher = threading.Thread(target=self._watch, args=(read, note), name="ctrl-c", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(before_fd)
            signal.signal(signal.SIGINT, before)
            os.close(write)  # the watcher reads the end of the pipe and returns
            watcher.join()
            os.close(read)

    def _watch(self, fd: int, note: Callable[[str], None]) -> None:
        presses = 0
        while chunk := os.read(fd, 64):  # one byte per signal: its number
            before, presses = presses, presses + chunk.count(signal.SIGINT)
            if presses >= 2:
                _abort()
            if before == 0 and presses == 1:
                self.interrupted = True
                note("Ctrl-C: stopping after this step, its progress saved (Ctrl-C again to stop at once, losing "
                     "the steps since the last checkpoint)")


def _abort() -> None:
    """Out now, from the watcher thread: the main thread may be inside a torch call for a while yet. Straight to the
    file descriptors (another thread may hold sys.stdout's lock); the cursor a progress bar hid is shown again."""
    if os.isatty(1):
        os.write(1, b"\x1b[?25h")
    os.write(2, b"\ninterrupted: stopped at once; the next run resumes from the last checkpoint\n")
    os._exit(INTERRUPTED)
