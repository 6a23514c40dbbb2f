"""`dflash generate --url` and `dflash chat --url`: the same commands against any OpenAI-compatible server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import DflashError
from ..remote.client import Remote
from ..remote.stats import footer, json_stats, stats


def _sampling(o) -> dict:
    body = {} if o.max_tokens is None else {"max_tokens": o.max_tokens}  # None: the server's default
    for key in ("temperature", "top_p", "top_k", "seed"):
        if getattr(o, key) is not None:
            body[key] = getattr(o, key)
    if o.think is not None:
        body["chat_template_kwargs"] = {"enable_thinking": o.think}
    return body


def _local_only(o, names) -> None:
    for name in names:
        if getattr(o, name, None) not in (None, False):
            raise DflashError(f"--{name.replace('_', '-')} applies to the local engine; with --url the server decides")


def remote_generate(o, console) -> None:
    from .common import read_prompt

    _local_only(o, ("draft", "draft_len", "device", "dtype", "trace", "show_drafts"))
    text = read_prompt(o.prompt, o.prompt_file)
    if o.max_tokens is not None and o.max_tokens < 1:
        raise DflashError(f"--max-tokens must be >= 1 (got {o.max_tokens})")
    if o.raw and o.system:
        raise DflashError("--system needs the chat template; drop --raw")
    remote = Remote(o.url, o.api_key, o.model)
    body = _sampling(o)
    if o.stop:
        body["stop"] = list(o.stop)  # the server cuts the answer there (OpenAI's `stop`)
    if o.raw:
        path, body["prompt"] = "/v1/completions", text
        body.pop("chat_template_kwargs", None)
    else:
        path = "/v1/chat/completions"
        body["messages"] = ([{"role": "system", "content": o.system}] if o.system else []) + [
            {"role": "user", "content": text}]
    before = remote.counters()
    if o.json:
        reply = remote.complete(path, body)
    else:
        wrote = []
        try:
            reply = remote.complete(path, body, on_text=lambda piece: (wrote.append(1), sys.stdout.write(piece),
                                                                       sys.stdout.flush()))
        finally:
            if wrote:
                sys.stdout.write("\n")
                sys.stdout.flush()
    st = stats(reply, before, remote.counters() if before else None)
    usage = reply.get("usage") or {}
    if o.json:
        print(json.dumps({"text": reply["text"], "prompt_tokens": usage.get("prompt_tokens"),
                          "completion_tokens": usage.get("completion_tokens"), "finish_reason": reply["finish_reason"],
                          "stats": json_stats(st)}, ensure_ascii=False))
    else:
        print(footer(st, usage.get("completion_tokens")), file=sys.stderr)


def remote_chat(o, console) -> None:
    _local_only(o, ("draft", "draft_len", "device", "dtype", "show_drafts", "context"))
    if o.max_tokens is not None and o.max_tokens < 1:
        raise DflashError(f"--max-tokens must be >= 1 (got {o.max_tokens})")
    remote = Remote(o.url, o.api_key, o.model)
    interactive = sys.stdin.isatty()
    system, messages, last = o.system, [], None
    say = lambda msg, style="dim": console.print(msg, style=style, markup=False, highlight=False)  # noqa: E731
    if interactive:
        say(f"dflash chat · {remote.model} at {remote.root} · commands: /clear, /system TEXT, /stats, /save FILE, "
            "/exit")
    while True:
        try:
            line = console.input("[bold green]>>> [/]") if interactive else _read_line()
        except EOFError:
            break
        except KeyboardInterrupt:
            console.print()
            continue
        line = line.strip()
        if not line:
            continue
        name, _, arg = line.partition(" ")
        if name in ("/exit", "/quit"):
            break
        if name == "/clear":
            messages.clear()
            say("conversation cleared")
        elif name == "/system":
            system = arg.strip() or None
            say(f"system prompt {'set' if system else 'removed'}")
        elif name == "/stats":
            say(f"{len(messages) // 2} turns" + (f" · last answer: {last}" if last else ""), "")
        elif name == "/save":
            _save(Path(arg.strip()) if arg.strip() else None, remote.model, system, messages, say)
        elif name.startswith("/"):
            say(f"unknown command {name}", "red")
        else:
            turn = [{"role": "user", "content": line}]
            body = {**_sampling(o), "messages": ([{"role": "system", "content": system}] if system else [])
                    + messages + turn}
            before = remote.counters()
            pieces = []
            try:
                reply = remote.complete("/v1/chat/completions", body, on_text=lambda piece: (
                    pieces.append(piece), sys.stdout.write(piece), sys.stdout.flush()))
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                if pieces:  # as in the local chat: what was written stays in the conversation
                    messages += turn + [{"role": "assistant", "content": "".join(pieces)}]
                say("[stopped]")
                continue
            except DflashError as exc:
                say(f"error: {exc}", "red")
                continue
            sys.stdout.write("\n")
            sys.stdout.flush()
            messages += turn + [{"role": "assistant", "content": reply["text"]}]
            last = footer(stats(reply, before, remote.counters() if before else None),
                          (reply.get("usage") or {}).get("completion_tokens"))
            if interactive:
                say(last)


def _save(path, model, system, messages, say) -> None:
    if path is None:
        say("usage: /save FILE", "red")
        return
    head = [{"role": "system", "content": system}] if system else []
    try:
        path.expanduser().write_text(json.dumps({"model": model, "system": system, "messages": head + messages},
                                                indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        say(f"saved {len(messages)} messages to {path}")
    except OSError as exc:
        say(f"error: cannot save to {path}: {exc.strerror}", "red")


def _read_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line
