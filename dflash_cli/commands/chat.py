"""`dflash chat`: a REPL whose conversation stays in the KV cache between turns."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import hub
from ..options import ChatOptions, data_dir
from ..conversation import Conversation
from ..runtime.decoders import check_draft_len, make_decoder, unused_draft_len
from ..runtime.generation import Request, Result, generate
from ..runtime.sampling_ranges import invalid
from ..runtime.session import Session
from ..errors import DflashError
from ..runtime.bundle import open_bundle
from ..registry import Registry
from ..ui.stream import LEGEND, StreamView
from .common import (RepetitionGuard, capture_graphs, finish_reason, has_thinking, no_thinking,
                     set_threads, tee, warn)

__all__ = ["ChatOptions", "ChatRepl"]

HELP = "commands: /help, /set, /load FILE, /save FILE, /clear, /system TEXT, /think on|off, /stats, /exit"
# /help: two columns, the second wrapped to the terminal's width.
HELP_ROWS = (
    ("/help", "this list"),
    ("/set NAME VALUE", "change a setting: temperature, top_p, top_k, max_tokens, draft (none, dflash, dflash2, "
                        "eagle3, mtp or a drafter path), draft_len; /set alone shows them"),
    ("/load FILE", "continue a conversation saved with /save"),
    ("/save FILE", "save the conversation as JSON"),
    ("/clear", "start a new conversation"),
    ("/system TEXT", "set the system prompt (/system alone removes it)"),
    ("/think on|off", "thinking mode, for models whose template has one"),
    ("/stats", "context use and the last answer's speed"),
    ("/exit", "leave (or Ctrl-D)"),
    ("input", "arrows edit and recall history; a paste of several lines is one message; \"\"\" starts and ends a "
              "multi-line message (Alt-Enter also adds a line); Ctrl-C clears the line or stops an answer"),
    ("footer", "\n".join(line.strip() for line in LEGEND.removeprefix("footer:").splitlines())),
)
CPU_DEFAULT_CONTEXT = 4096
MAX_DEFAULT_ANSWER = 2048
MULTILINE = '"""'


def default_max_tokens(context: int) -> int:
    """An answer budget that leaves room for the conversation: half the context, at most 2048."""
    return max(1, min(MAX_DEFAULT_ANSWER, context // 2))


class ChatRepl:
    def __init__(self, o: ChatOptions, console: Console):
        self.o, self.console = o, console
        if o.threads is not None and o.threads < 1:
            raise DflashError(f"--threads must be >= 1 (got {o.threads})")
        if o.draft_len is not None and o.draft_len < 1:
            raise DflashError(f"--draft-len must be >= 1 (got {o.draft_len})")
        self.bundle = open_bundle(Registry.load().resolve(o.model), o.device, o.dtype)
        limit = self.bundle.context_limit()
        context = o.context or (min(limit, CPU_DEFAULT_CONTEXT) if self.bundle.device.type == "cpu" else limit)
        if context < 16 or context > limit:
            raise DflashError(f"--context must be between 16 and {limit} (got {context})")
        self.max_tokens = default_max_tokens(context) if o.max_tokens is None else o.max_tokens
        if self.max_tokens < 1:
            raise DflashError(f"--max-tokens must be >= 1 (got {self.max_tokens})")
        if self.max_tokens >= context:
            raise DflashError(f"--max-tokens {self.max_tokens} does not fit the context of {context} tokens "
                              f"(use --context or a smaller --max-tokens)")
        self.params = self.bundle.sampling(o.temperature, o.top_p, o.top_k, o.seed)
        set_threads(o.threads, self.bundle, self.bundle.device)
        self.draft, self.draft_len = o.draft, o.draft_len
        self.decoder = make_decoder(self.bundle, o.draft, o.draft_len)
        check_draft_len(self.decoder, o.draft_len)
        if unused := unused_draft_len(self.decoder, o.draft_len):
            warn(unused)
        if o.think is not None and not self.has_thinking():
            warn(f"{'--think' if o.think else '--no-think'}: {no_thinking(self.bundle.entry.name)}")
        self.session = Session(self.bundle.load_model(), context)
        capture_graphs(self.session, self.decoder, self.params, switchable=True)
        self.conv = Conversation(self.bundle.tokenizer, system=o.system, think=o.think)
        self.results: list[Result] = []
        self.reasons: list[str] = []
        self.interactive = sys.stdin.isatty() and sys.stdout.isatty()
        self._prompt = None

    def say(self, msg: str, style: str = "dim") -> None:
        # In a pipe, one line a message (Rich would break it at 80 columns, in the middle of /stats' figures).
        self.console.print(msg, style=style, markup=False, highlight=False, soft_wrap=not self.interactive)

    # Input

    def read(self) -> str:
        """One message: a line, a paste of several lines, or a \"\"\"-delimited block. EOFError at the end."""
        if self.interactive:
            if self._prompt is None:
                self._prompt = _prompt_session(self.o.history)
            text = self._prompt.prompt(">>> ")
        else:
            text = _read_line()
            if text.lstrip().startswith(MULTILINE):
                while not _closed(text):
                    try:
                        text += _read_line()
                    except EOFError:
                        break
        stripped = text.strip()
        if stripped.startswith(MULTILINE):
            stripped = stripped[len(MULTILINE):]
            if stripped.endswith(MULTILINE):
                stripped = stripped[: -len(MULTILINE)]
            return stripped.strip("\n")
        return text.strip()

    def run(self) -> None:
        if self.interactive:
            self.say(f"dflash chat · {self.bundle.entry.name} on {self.bundle.device} · {self.session.max_len}-token "
                     f"context · /help, Ctrl-D to leave")
        while True:
            try:
                line = self.read()
            except EOFError:  # Ctrl-D (prompt_toolkit ends the line, so the shell's prompt starts on its own)
                break
            except KeyboardInterrupt:
                if not self.interactive:
                    self.console.print()
                continue
            if not line.strip():
                continue
            if line.startswith("/") and "\n" not in line:
                try:
                    with hub.keep_process_on_ctrl_c():  # /set draft may download a drafter
                        if self.command(line) == "exit":
                            break
                except KeyboardInterrupt:
                    self.say(f"interrupted: {line.split()[0]} stopped; the conversation is kept", "yellow")
                continue
            self.answer(line)

    # Commands

    def command(self, line: str):
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit", "/bye"):
            return "exit"
        if name in ("/help", "/?"):
            self.print_help()
        elif name == "/clear":
            self.session.reset()
            self.conv.messages.clear()
            self.say("conversation cleared")
        elif name == "/system":
            self.conv.system = arg or None
            self.session.reset()  # the system prompt heads the cache: re-prefill next turn
            self.say(f"system prompt {'set' if arg else 'removed'}")
        elif name == "/think":
            if arg not in ("on", "off"):
                self.say("usage: /think on|off", "red")
            elif not self.has_thinking():
                self.say(no_thinking(self.bundle.entry.name), "yellow")
            else:
                self.conv.think = arg == "on"
                self.session.reset()
                self.say(f"thinking {arg}")
        elif name == "/stats":
            self.print_stats()
        elif name == "/set":
            self.set(arg)
        elif name == "/save":
            if not arg:
                self.say("usage: /save FILE", "red")
            else:
                try:
                    self.conv.save(Path(arg), self.bundle.entry.name)
                    self.say(f"saved {_count(len(self.conv.messages), 'message')} to {arg}")
                except DflashError as exc:
                    self.say(f"error: {exc}", "red")
        elif name == "/load":
            self.load(arg)
        else:
            self.say(f"unknown command {name}; {HELP}", "red")
        return None

    def print_help(self) -> None:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column()
        for key, text in HELP_ROWS:
            grid.add_row(Text(key), Text(text))
        self.console.print(grid)

    def has_thinking(self) -> bool:
        return has_thinking(self.bundle.tokenizer)

    def settings(self) -> str:
        p = self.params
        return (f"temperature {p.temperature:g} · top_p {p.top_p:g} · top_k {p.top_k} · max_tokens {self.max_tokens} · "
                f"draft {self.decoder.kind} · draft_len {getattr(self.decoder, 'draft_len', '—')}")

    def set(self, arg: str) -> None:
        name, _, value = arg.partition(" ")
        value = value.strip()
        if not name:
            self.say(self.settings(), "")
            return
        if not value:
            self.say("usage: /set temperature|top_p|top_k|max_tokens|draft|draft_len VALUE", "red")
            return
        try:
            if name in ("temperature", "top_p", "top_k"):
                params = self.params
                new = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
                new[name] = int(value) if name == "top_k" else float(value)
                bad = invalid(**new)
                if bad is not None:
                    raise DflashError(" ".join(bad))  # the setting's name, not the command line's flag
                self.params = dataclasses.replace(params, **new)
            elif name == "max_tokens":
                n = int(value)
                if not 1 <= n < self.session.max_len:
                    raise DflashError(f"max_tokens must be between 1 and {self.session.max_len - 1}")
                self.max_tokens = n
            elif name in ("draft", "draft_len"):
                draft = value if name == "draft" else self.draft
                draft_len = self.draft_len if name == "draft" else int(value)
                if draft_len is not None and draft_len < 1:
                    raise DflashError(f"draft_len must be >= 1 (got {draft_len})")
                decoder = make_decoder(self.bundle, draft, draft_len)
                check_draft_len(decoder, draft_len, "draft_len")
                self.decoder, self.draft, self.draft_len = decoder, draft, draft_len
                self.session.reset()  # a new drafter has not seen the conversation: re-prefill it next turn
                capture_graphs(self.session, decoder, self.params, switchable=True)
            else:
                self.say(f"unknown setting {name}: temperature, top_p, top_k, max_tokens, draft, draft_len", "red")
                return
        except ValueError:
            self.say(f"not a number: {value}", "red")
            return
        except DflashError as exc:
            self.say(f"error: {exc}", "red")
            return
        self.say(self.settings())

    def load(self, arg: str) -> None:
        if not arg:
            self.say("usage: /load FILE", "red")
            return
        try:
            messages = _saved_messages(json.loads(Path(arg).expanduser().read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            self.say(f"error: cannot load {arg}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", "red")
            return
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self.say(f"error: cannot load {arg}: {getattr(exc, 'strerror', None) or exc}", "red")
            return
        system = [m["content"] for m in messages if m["role"] == "system"]
        self.conv.system = system[0] if system else self.conv.system
        self.conv.messages = [dict(role=m["role"], content=m["content"]) for m in messages if m["role"] != "system"]
        self.session.reset()
        self.say(f"loaded {_count(len(self.conv.messages), 'message')} from {arg}")

    # Answers

    def fit(self, text: str):
        """Token ids for the new turn; drops the oldest turns (never the system prompt) when the turn and
        an answer would not fit. Returns None (and says why) when the message alone is too long."""
        s, tok = self.session, self.bundle.tokenizer
        fresh = s.length == 0 and not s.pending
        ids, reset = self.conv.prompt_ids(text, s.pending, fresh)
        reserve = min(self.max_tokens, max(1, s.max_len // 4))  # room for at least part of an answer
        used = 0 if reset else s.length + len(s.pending)
        if used + len(ids) + reserve < s.max_len:
            return ids, reset
        dropped = 0
        while True:  # counted on the turns kept; the conversation loses them only once the message fits
            kept = self.conv.messages[2 * dropped:]
            full = tok.encode(tok.render_chat(self.conv.all_messages([{"role": "user", "content": text}], kept),
                                              think=self.conv.think))
            if len(full) + reserve < s.max_len or not kept:
                break
            dropped += 1
        if len(full) + 1 >= s.max_len:
            self.say(f"this message is {len(full)} tokens with the system prompt; the context holds {s.max_len}: "
                     f"shorten it, or start with a larger --context", "yellow")
            return None
        del self.conv.messages[: 2 * dropped]
        if dropped:
            self.say(f"context full: dropped the oldest {_count(dropped, 'turn')} (the system prompt stays)")
        s.reset()
        return full, True

    def answer(self, text: str) -> None:
        s = self.session
        try:
            fitted = self.fit(text)
        except DflashError as exc:
            self.say(f"error: {exc}", "red")
            return
        if fitted is None:
            return
        ids, reset = fitted
        if reset:
            s.reset()
        tok = self.bundle.tokenizer
        max_tokens = max(1, min(self.max_tokens, s.max_len - s.length - len(s.pending) - len(ids) - 1))
        req = Request(prompt_ids=ids, params=self.params, max_tokens=max_tokens, stop_ids=tok.stop_ids)
        guard = RepetitionGuard(self.o.repeat_guard)
        with _keys_wait(self.interactive), \
                StreamView(self.console, tok, tok.stop_ids, show_drafts=self.o.show_drafts) as view:
            result = generate(s, self.decoder, req, on_step=tee(view.on_step, guard.on_step))
            reason = view.finish_reason = finish_reason(result, guard)
        if not result.tokens:
            self.say("[stopped]")
            return
        self.results.append(result)
        self.reasons.append(reason)
        stops = set(tok.stop_ids)
        self.conv.add_exchange(text, tok.decode([t for t in result.tokens if t not in stops]))
        if reason == "interrupted":
            self.say("[stopped]")
        elif reason == "repetition":
            self.say("[stopped: the answer was repeating itself; --no-repeat-guard to allow it]")
        elif reason == "context":
            self.say(f"[the context is full ({s.max_len} tokens): the next message drops the oldest turns]")

    def print_stats(self) -> None:
        s = self.session
        turns = _count(len(self.conv.messages) // 2, "turn")
        cached = s.length + len(s.pending)
        if cached == 0 and self.conv.messages:  # after /load, /system, /think or /set draft: read in anew next turn
            tok = self.bundle.tokenizer
            waiting = len(tok.encode(tok.render_chat(self.conv.all_messages(), add_generation_prompt=False,
                                                     think=self.conv.think)))
            self.say(f"context 0/{s.max_len} tokens · {turns} ({waiting} tokens), read into the cache with the next "
                     f"message", "")
        else:
            self.say(f"context {cached}/{s.max_len} tokens · {turns}", "")
        if not self.results:
            return
        last = self.results[-1].stats()
        total_tokens = sum(len(r.tokens) for r in self.results)
        self.say(f"last answer: {len(self.results[-1].tokens)} tok · {last['decode_tok_per_s']:.1f} tok/s · "
                 f"τ {last['mean_accepted']:.2f} · finish {self.reasons[-1]}", "")
        self.say(f"  first token {last['ttft_s'] * 1000:.0f} ms · {last['steps']} steps · draft {last['draft_s']:.3f} s · "
                 f"verify {last['verify_s']:.3f} s", "")
        captures = sum(r.graph_captures for r in self.results)
        self.say(f"session: {total_tokens} tokens in {_count(len(self.results), 'answer')} · "
                 f"{_count(captures, 'graph capture')} after load", "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _saved_messages(data) -> list[dict]:
    """The messages of a conversation /save wrote ({"messages": [...]}, or the bare list); ValueError says what is
    missing or wrong."""
    if isinstance(data, dict):
        if "messages" not in data:
            raise ValueError('no "messages" in it (a file /save wrote has a list of {role, content} there)')
        data = data["messages"]
    if not isinstance(data, list):
        raise ValueError('"messages" is not a list of {role, content}')
    for i, m in enumerate(data, 1):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ValueError(f"message {i} has no role system, user or assistant")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} has no content text")
    return data


@contextlib.contextmanager
def _keys_wait(interactive: bool):
    """While an answer streams: keys typed are not echoed into it and wait for the next prompt (Ctrl-D too,
    which a line-mode terminal would otherwise turn into an end of input); Ctrl-C still interrupts."""
    if not interactive:
        yield
        return
    try:
        import termios
        import tty

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
    except (ImportError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _closed(text: str) -> bool:
    body = text.strip()
    return len(body) >= 2 * len(MULTILINE) and body.endswith(MULTILINE)


def _read_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line


def _prompt_session(history: Path | None):
    """prompt_toolkit: line editing, history across runs, pasted lines kept as one message, \"\"\" blocks."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    path = Path(history).expanduser() if history else data_dir() / "chat_history"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        hist = FileHistory(str(path))
    except OSError:
        hist = InMemoryHistory()

    kb = KeyBindings()

    @kb.add("enter")
    def _(event):
        buf = event.current_buffer
        if buf.text.lstrip().startswith(MULTILINE) and not _closed(buf.text):
            buf.insert_text("\n")  # inside a """ block: Enter adds a line
        else:
            buf.validate_and_handle()

    @kb.add("escape", "enter")
    def _(event):
        event.current_buffer.insert_text("\n")

    return PromptSession(history=hist, multiline=True, key_bindings=kb, prompt_continuation="... ",
                         enable_history_search=False)
