"""`dflash generate --url` and `dflash chat --url`: the same commands against any OpenAI-compatible server.

Statistics come from the server's `dflash` response field (`dflash serve`); otherwise from the difference of its
vLLM-style spec-decode counters on /metrics before and after the request (vLLM, or any server using the names).
HTTP uses the standard library (urllib), so --url needs no client package beyond the base install.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .errors import DflashError
from .ui.stream import histogram

TIMEOUT_S = 600
_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)')
_POSITION = re.compile(r'position="(\d+)"')
SPEC = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"  # a gauge (recent mean committed length), not a counter


class Remote:
    def __init__(self, url: str, api_key: str | None, model: str | None):
        if not re.match(r"^https?://[^/\s]+", url or ""):
            raise DflashError(f"--url must look like http://HOST:PORT (got '{url}')")
        root = url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.api_key = api_key
        self.model = model or self._first_model()

    def _open(self, path: str, body: dict | None = None, timeout: float = TIMEOUT_S):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.root + path, data=data, headers=headers, method="POST" if data else "GET")
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raise DflashError(f"{self.root} answered {exc.code}: {_error_message(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise DflashError(f"cannot reach {self.root}: {getattr(exc, 'reason', exc)}") from None

    def _first_model(self) -> str:
        with self._open("/v1/models", timeout=30) as resp:
            data = json.load(resp).get("data") or []
        if not data:
            raise DflashError(f"{self.root}/v1/models lists no model: pass --model")
        return data[0]["id"]

    def counters(self) -> dict | None:
        """The server's spec-decode counters, or None where it has no /metrics."""
        try:
            with self._open("/metrics", timeout=10) as resp:
                text = resp.read().decode("utf-8", "replace")
        except DflashError:
            return None
        out: dict = {"per_pos": {}}
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if not m:
                continue
            name, labels, value = m.groups()
            try:
                v = float(value)
            except ValueError:
                continue
            if name in SPEC:
                out[SPEC[name]] = out.get(SPEC[name], 0.0) + v
            elif name == PER_POS and labels and (pos := _POSITION.search(labels)):
                out["per_pos"][int(pos.group(1))] = out["per_pos"].get(int(pos.group(1)), 0.0) + v
            elif name == SGLANG_ACCEPT_LENGTH:
                out["accept_length"] = v
        return out if "drafts" in out or "accept_length" in out else None

    def complete(self, path: str, body: dict, on_text=None) -> dict:
        """POST a (streamed, when on_text is given) request; returns {text, finish_reason, usage, dflash, ttft_s,
        elapsed_s}. Ctrl-C closes the connection, which stops the generation on the server."""
        chat = path.endswith("/chat/completions")
        body = {"model": self.model, **body, "stream": on_text is not None}
        t0 = time.perf_counter()
        out = {"text": "", "finish_reason": None, "usage": None, "dflash": None, "ttft_s": None}
        with self._open(path, body) as resp:
            if on_text is None:
                data = json.load(resp)
                choice = (data.get("choices") or [{}])[0]
                out.update(text=(choice.get("message") or {}).get("content") or "" if chat else choice.get("text", ""),
                           finish_reason=choice.get("finish_reason"), usage=data.get("usage"), dflash=data.get("dflash"))
            else:
                for raw in resp:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    event = json.loads(payload)
                    if "error" in event:
                        raise DflashError(f"{self.root}: {event['error'].get('message', event['error'])}")
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                        if piece:
                            if out["ttft_s"] is None:
                                out["ttft_s"] = time.perf_counter() - t0
                            out["text"] += piece
                            on_text(piece)
                        out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
                    out["usage"] = event.get("usage") or out["usage"]
                    out["dflash"] = event.get("dflash") or out["dflash"]
        out["elapsed_s"] = time.perf_counter() - t0
        return out


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
        err = body.get("error", body)
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, OSError, AttributeError):
        return exc.reason


def stats(reply: dict, before: dict | None, after: dict | None) -> dict:
    """Our statistics from the reply's `dflash` field, else the spec-decode counters' difference."""
    if reply.get("dflash"):
        return {"source": "dflash", **reply["dflash"]}
    out: dict = {"source": "none"}
    usage = reply.get("usage") or {}
    n = usage.get("completion_tokens")
    if n and reply.get("ttft_s") is not None and reply["elapsed_s"] > reply["ttft_s"]:
        out["decode_tokens_per_s"] = round((n - 1) / (reply["elapsed_s"] - reply["ttft_s"]), 3)
        out["ttft_s"] = round(reply["ttft_s"], 6)
    if before and after and "drafts" not in after and "accept_length" in after:
        out.update(source="gauge", tau=round(after["accept_length"], 4))
    elif before and after and "drafts" in after:
        drafts = after["drafts"] - before.get("drafts", 0)
        if drafts > 0:
            accepted = after.get("accepted", 0) - before.get("accepted", 0)
            width = max(after["per_pos"], default=-1) + 1
            per_pos = [after["per_pos"].get(i, 0) - before["per_pos"].get(i, 0) for i in range(width)]
            out.update(source="metrics", drafts=int(drafts), tau=round(1 + accepted / drafts, 4),
                       acceptance_by_position=[round(p / drafts, 4) for p in per_pos])
    return out


def footer(st: dict, n_tokens: int | None) -> str:
    parts = [f"{n_tokens} tok"] if n_tokens is not None else []
    if "decode_tokens_per_s" in st:
        parts.append(f"{st['decode_tokens_per_s']:.1f} tok/s")
    if st.get("ttft_s") is not None:
        parts.append(f"ttft {st['ttft_s'] * 1000:.0f} ms")
    if "tau" in st:
        parts.append(f"τ {st['tau']:.2f}")
    if st.get("accepted_length_histogram"):
        parts.append("accepted " + histogram(st["accepted_length_histogram"]))
    if st.get("acceptance_by_position"):
        parts.append("by pos " + " ".join(f"{p * 100:.0f}" for p in st["acceptance_by_position"][:8]))
    if st["source"] == "metrics":
        parts.append("(server /metrics)")
    elif st["source"] == "gauge":
        parts.append("(server's recent mean)")
    return " · ".join(parts)


def _sampling(o) -> dict:
    body = {"max_tokens": o.max_tokens}
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
    from .commands.common import read_prompt

    _local_only(o, ("draft", "draft_len", "device", "dtype", "trace", "show_drafts"))
    text = read_prompt(o.prompt, o.prompt_file)
    if o.max_tokens < 1:
        raise DflashError(f"--max-tokens must be >= 1 (got {o.max_tokens})")
    if o.raw and o.system:
        raise DflashError("--system needs the chat template; drop --raw")
    remote = Remote(o.url, o.api_key, o.model)
    body = _sampling(o)
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
                          "stats": st}, ensure_ascii=False))
    else:
        print(footer(st, usage.get("completion_tokens")), file=sys.stderr)


def remote_chat(o, console) -> None:
    _local_only(o, ("draft", "draft_len", "device", "dtype", "show_drafts", "context"))
    if o.max_tokens < 1:
        raise DflashError(f"--max-tokens must be >= 1 (got {o.max_tokens})")
    remote = Remote(o.url, o.api_key, o.model)
    interactive = sys.stdin.isatty()
    system, messages, last = o.system, [], None
    say = lambda msg, style="dim": console.print(msg, style=style, markup=False, highlight=False)  # noqa: E731
    if interactive:
        say(f"dflash chat · {remote.model} at {remote.root} · commands: /clear, /system TEXT, /stats, /save FILE, /exit")
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
            try:
                reply = remote.complete("/v1/chat/completions", body,
                                        on_text=lambda piece: (sys.stdout.write(piece), sys.stdout.flush()))
            except KeyboardInterrupt:
                sys.stdout.write("\n")
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
