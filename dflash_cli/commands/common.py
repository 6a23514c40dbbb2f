"""Pieces every generating command shares: prompt input, sampling defaults, threads, stop reasons, checks."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..errors import DflashError
from ..runtime.sampling_ranges import check_sampling

DEFAULT_MAX_TOKENS = 512
# Below this, one thread: the demo target (15 MB) on a 2-core CPU decodes 194-224 tok/s on 1 thread, 168-257 on 2 when
# the machine is idle, but 63 on 1 and 5 on 2 when another process keeps a core busy (torch threads wait on it).
SMALL_MODEL_BYTES = 256 * 2**20


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from --prompt, --prompt-file (`-`: stdin) or piped stdin, checked: not empty, valid UTF-8."""
    if prompt is not None and prompt_file is not None:
        raise DflashError("give either --prompt or --prompt-file, not both")
    if prompt is not None:
        text, source = prompt, "--prompt"
    elif prompt_file is not None and str(prompt_file) == "-":
        text, source = sys.stdin.read(), "stdin"
    elif prompt_file is not None:
        try:
            text = Path(prompt_file).expanduser().read_text(encoding="utf-8-sig")  # -sig: an editor's BOM is no prompt
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise DflashError(f"cannot read prompt file {prompt_file}: {reason}") from None
        source = f"prompt file {prompt_file}"
    elif not sys.stdin.isatty() and (text := sys.stdin.read()):
        source = "stdin"
    else:
        raise DflashError("no prompt: use --prompt TEXT, --prompt-file FILE or pipe text on stdin")
    if not text.strip():
        raise DflashError(f"the prompt is {'empty' if text == '' else 'only whitespace'} ({source})")
    try:
        text.encode("utf-8")  # argv and stdin decode undecodable bytes to lone surrogates, which tokenizers refuse
    except UnicodeEncodeError as exc:
        raise DflashError(f"the prompt is not valid UTF-8 ({source}, character {exc.start})") from None
    return text


def check_generate(o) -> str:
    """generate's input checks that need no model, so that they answer before torch is imported; returns the prompt."""
    text = read_prompt(o.prompt, o.prompt_file)
    check_chat(o)
    if o.raw and o.system:
        raise DflashError("--system needs the chat template; drop --raw")
    check_writable(o.trace, "--trace")
    if any(not stop for stop in o.stop or ()):
        raise DflashError("--stop needs a text (got an empty one)")
    return text


def check_chat(o) -> None:
    """The counts and sampling flags generate and chat share, checked before any model (chat: the context's and the
    model's limits come after the tokenizer)."""
    for flag, value in (("--max-tokens", o.max_tokens), ("--draft-len", o.draft_len), ("--threads", o.threads)):
        if value is not None and value < 1:
            raise DflashError(f"{flag} must be >= 1 (got {value})")
    check_sampling(o.temperature, o.top_p, o.top_k, o.seed)


def warn(message: str) -> None:
    """A flag that does nothing here: one line on stderr, and the command goes on."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def has_thinking(tokenizer) -> bool:
    """Whether the chat template has a thinking mode: --think and --no-think render differently."""
    probe = [{"role": "user", "content": "x"}]
    try:
        return tokenizer.render_chat(probe, think=True) != tokenizer.render_chat(probe, think=False)
    except DflashError:
        return False


def no_thinking(model: str) -> str:
    return f"{model} has no thinking mode (its chat template ignores it)"


def available_cpus() -> int:
    """The logical CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyper-threads counted once)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        cores.add(siblings)
    return max(1, len(cores))


def weights_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))


def set_threads(threads: int | None, bundle_or_folder, device) -> int | None:
    """torch's CPU threads: the flag, else 1 for small models (faster, and immune to a busy neighbour), else the
    physical cores available to this process (never more threads than cores). Returns the count set."""
    import torch

    if threads is not None and threads < 1:
        raise DflashError(f"--threads must be >= 1 (got {threads})")
    # More threads than CPUs only makes torch wait on itself, and a great many crash it (100000: a segfault).
    if threads is not None and threads > (cpus := available_cpus()):
        raise DflashError(f"--threads {threads} is more than the {cpus} CPU{'s' * (cpus != 1)} this process may run on")
    if threads is None:
        if getattr(device, "type", device) != "cpu":
            return None
        folder = getattr(bundle_or_folder, "target_dir", bundle_or_folder)
        small = folder is not None and weights_bytes(folder) < SMALL_MODEL_BYTES
        threads = 1 if small else physical_cores()
    torch.set_num_threads(threads)
    return threads


def check_writable(path: Path | None, flag: str) -> None:
    """Fail before any work if an output file cannot be written (the folder is missing or read-only, ...)."""
    if path is None:
        return
    p = Path(path).expanduser()
    if p.is_dir():
        raise DflashError(f"{flag} {path} is a folder, not a file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise DflashError(f"cannot write {flag} {path}: no such folder {parent}")
    existed = p.exists()
    try:
        with open(p, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise DflashError(f"cannot write {flag} {path}: {exc.strerror}") from None
    if not existed:
        p.unlink(missing_ok=True)


def finish_reason(result, guard=None, stop=None) -> str:
    """Why an answer ended: stop (a stop token, or a --stop text: `stop`), length (max tokens), context (the cache is
    full), interrupted (Ctrl-C) or repetition (the repetition guard)."""
    if guard is not None and guard.tripped:
        return "repetition"
    if stop is not None and stop.tripped:
        return "stop"
    if result.interrupted:
        return "interrupted"
    if result.context_full:
        return "context"
    return result.finish_reason


class RepetitionStop(KeyboardInterrupt):
    """Raised by the repetition guard inside a step callback: the generation loop ends the answer as it does
    for Ctrl-C (tokens kept, session consistent); `finish_reason` then tells the two apart."""


class RepetitionGuard:
    """Stops an answer stuck in a loop: the last tokens are one pattern repeated back to back.

    A loop is a period of 1-64 tokens repeated at least `repeats` (3) times and covering at least
    `min_tokens` (32) tokens (so a short legitimate repetition, like a row of `=`, passes)."""

    def __init__(self, enabled: bool = True, repeats: int = 3, min_tokens: int = 32, max_period: int = 64):
        self.enabled, self.repeats, self.min_tokens, self.max_period = enabled, repeats, min_tokens, max_period
        self.tokens: list[int] = []
        self.tripped = False

    def on_step(self, step) -> None:
        if not self.enabled:
            return
        self.tokens.extend(step.emitted)
        if self.looping(self.tokens):
            self.tripped = True
            raise RepetitionStop()

    def looping(self, toks: list[int]) -> bool:
        n = len(toks)
        for period in range(1, self.max_period + 1):
            span = max(period * self.repeats, self.min_tokens)
            if span > n:
                break
            tail = toks[n - span :]
            if all(tail[i] == tail[i - period] for i in range(period, span)):
                return True
        return False


class StopSequence(KeyboardInterrupt):
    """Raised by `StopTexts.check` inside a step callback: the answer ends as for Ctrl-C (tokens kept, session
    consistent); `finish_reason` then says stop."""


class StopTexts:
    """--stop: the answer's text up to the first of these texts, which is not shown (serve's `stop` alike,
    runtime/stop_text.py). `on_step` takes a step's tokens before the view shows them; the view shows `take()`;
    `check` then ends the generation once a text appeared. Without texts, nothing."""

    def __init__(self, tokenizer, texts):
        from ..runtime.stop_text import StopText

        self.stop_ids = set(tokenizer.stop_ids)
        self.text = StopText(tokenizer.decode, list(texts)) if texts else None
        self.tripped = False
        self._shown = ""

    def on_step(self, step) -> None:
        if self.text is not None:
            self._shown += self.text.push([t for t in step.emitted if t not in self.stop_ids])

    def take(self) -> str:
        """The text that is certain since the last call (no possible start of a stop text held back)."""
        piece, self._shown = self._shown, ""
        return piece

    def finish(self) -> str:
        """What was held back, once the answer has ended."""
        return self.take() + self.text.finish()

    def check(self, step) -> None:
        if self.text is not None and self.text.hit:
            self.tripped = True
            raise StopSequence()


def tee(*fns):
    fns = [f for f in fns if f]
    return lambda step: [f(step) for f in fns]


def capture_graphs(session, decoder, params, switchable: bool = False) -> None:
    """runtime/warmup.prepare, its first-run notice on stderr (stdout may be JSON)."""
    from ..runtime.warmup import prepare

    prepare(session, decoder, params, switchable, notice=lambda text: print(text, file=sys.stderr, flush=True))


class StartupClock:
    """Where a command's start-up goes (generate --json's `startup_s`): a wall-clock mark after each stage, from the
    process's own start (Linux's /proc; elsewhere the first mark's)."""

    def __init__(self):
        now = time.time()
        self.marks = [("start", _process_start() or now), ("imports", now)]

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.time()))

    def stages(self, first_token_unix: float) -> dict:
        """Seconds per stage, the last one ("prefill") ending at the first token."""
        marks = self.marks + [("prefill", first_token_unix)] if first_token_unix else self.marks
        return {name: round(t - before, 3) for (_, before), (name, t) in zip(marks, marks[1:])}


def _process_start() -> float | None:
    """This process's start as a Unix time, from /proc (clock ticks since boot, against the boot clock: /proc/stat's
    btime is whole seconds), or None."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since
    except (OSError, ValueError, IndexError, AttributeError):
        return None
