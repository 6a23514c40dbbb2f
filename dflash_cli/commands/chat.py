"""`dflash chat`: a REPL whose conversation stays in the KV cache between turns."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ..conversation import Conversation
from ..drafters import make_decoder
from ..engine.generation import Request, Result, generate
from ..engine.session import Session
from ..errors import DflashError
from ..loading.bundle import open_bundle
from ..registry import Registry
from ..ui.stream import StreamView
from .common import DEFAULT_MAX_TOKENS, sampling_params

HELP = "commands: /clear, /system TEXT, /think on|off, /stats, /save FILE, /exit"
CPU_DEFAULT_CONTEXT = 4096


@dataclass
class ChatOptions:
    model: str | None = None
    system: str | None = None
    think: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int | None = None
    context: int | None = None
    device: str | None = None
    dtype: str | None = None
    draft: str | None = None
    draft_len: int | None = None
    show_drafts: bool = False
    url: str | None = None  # an OpenAI-compatible server instead of the local engine (dflash_cli/remote.py)
    api_key: str | None = None


class ChatRepl:
    def __init__(self, o: ChatOptions, console: Console):
        self.o, self.console = o, console
        self.bundle = open_bundle(Registry.load().resolve(o.model), o.device, o.dtype)
        limit = self.bundle.context_limit()
        context = o.context or (min(limit, CPU_DEFAULT_CONTEXT) if self.bundle.device.type == "cpu" else limit)
        if context < 16 or context > limit:
            raise DflashError(f"--context must be between 16 and {limit} (got {context})")
        self.params = sampling_params(self.bundle, o.temperature, o.top_p, o.top_k, o.seed)
        self.decoder = make_decoder(self.bundle, o.draft, o.draft_len)
        self.session = Session(self.bundle.load_model(), context)
        self.conv = Conversation(self.bundle.tokenizer, system=o.system, think=o.think)
        self.results: list[Result] = []
        self.interactive = sys.stdin.isatty()

    def say(self, msg: str, style: str = "dim") -> None:
        self.console.print(msg, style=style, markup=False, highlight=False)

    def run(self) -> None:
        if self.interactive:
            self.say(f"dflash chat · {self.bundle.entry.name} on {self.bundle.device} · {HELP}")
        while True:
            try:
                line = self.console.input("[bold green]>>> [/]") if self.interactive else _read_line()
            except EOFError:
                break
            except KeyboardInterrupt:
                self.console.print()
                continue
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if self.command(line) == "exit":
                    break
                continue
            self.answer(line)

    def command(self, line: str):
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit"):
            return "exit"
        if name == "/clear":
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
            else:
                self.conv.think = arg == "on"
                self.say(f"thinking {arg}")
        elif name == "/stats":
            self.print_stats()
        elif name == "/save":
            if not arg:
                self.say("usage: /save FILE", "red")
            else:
                try:
                    self.conv.save(Path(arg), self.bundle.entry.name)
                    self.say(f"saved {len(self.conv.messages)} messages to {arg}")
                except DflashError as exc:
                    self.say(f"error: {exc}", "red")
        else:
            self.say(f"unknown command {name}; {HELP}", "red")
        return None

    def answer(self, text: str) -> None:
        s = self.session
        fresh = s.length == 0 and not s.pending
        try:
            ids, reset = self.conv.prompt_ids(text, s.pending, fresh)
        except DflashError as exc:
            self.say(f"error: {exc}", "red")
            return
        if reset:
            s.reset()
        if len(s.pending) + len(ids) + 1 > s.room() + len(s.pending):
            self.say(f"the context is full ({s.length}/{s.max_len} tokens): /clear to start a new conversation", "yellow")
            return
        tok = self.bundle.tokenizer
        req = Request(prompt_ids=ids, params=self.params, max_tokens=self.o.max_tokens, stop_ids=tok.stop_ids)
        with StreamView(self.console, tok, tok.stop_ids, show_drafts=self.o.show_drafts) as view:
            result = generate(s, self.decoder, req, on_step=view.on_step)
        if not result.tokens:
            self.say("[stopped]")
            return
        self.results.append(result)
        stops = set(tok.stop_ids)
        self.conv.add_exchange(text, tok.decode([t for t in result.tokens if t not in stops]))
        if result.interrupted:
            self.say("[stopped]")
        if result.context_full:
            self.say(f"the context is full ({s.max_len} tokens): /clear to start a new conversation", "yellow")

    def print_stats(self) -> None:
        s = self.session
        self.say(f"context {s.length + len(s.pending)}/{s.max_len} tokens · {len(self.conv.messages) // 2} turns", "")
        if not self.results:
            return
        last = self.results[-1].stats()
        total_tokens = sum(len(r.tokens) for r in self.results)
        self.say(
            f"last answer: {len(self.results[-1].tokens)} tok · {last['decode_tok_per_s']:.1f} tok/s · "
            f"ttft {last['ttft_s'] * 1000:.0f} ms · {last['steps']} steps · "
            f"draft {last['draft_s']:.3f} s / verify {last['verify_s']:.3f} s", "")
        self.say(f"session: {total_tokens} tokens in {len(self.results)} answers", "")


def _read_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line


def run_chat(o: ChatOptions, console: Console) -> None:
    if o.url:
        from ..remote import remote_chat

        return remote_chat(o, console)
    ChatRepl(o, console).run()
