"""What `generate` and `chat` do before torch is imported: the input checks that need no model (a mistake is
answered at once, not after seconds of imports), then a status line on the terminal while torch, the tokenizer and
the weights load."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from ..options import ChatOptions, GenerateOptions
from ..registry import Registry
from ..ui.status import loading
from .common import check_chat, check_generate


def generate(o: GenerateOptions, console: Console) -> None:
    if o.url:
        from .remote import remote_generate

        return remote_generate(o, console)
    text = check_generate(o)
    o = dataclasses.replace(o, prompt=text, prompt_file=None)  # stdin is read once: the prompt travels as --prompt
    with loading(Registry.load().resolve(o.model).name) as status:
        from .generate import run_generate

        run_generate(o, console, status)


def chat(o: ChatOptions, console: Console) -> None:
    if o.url:
        from .remote import remote_chat

        return remote_chat(o, console)
    check_chat(o)
    with loading(Registry.load().resolve(o.model).name):
        from .chat import ChatRepl

        repl = ChatRepl(o, console)
    repl.run()
