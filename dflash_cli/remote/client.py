"""The HTTP side of `--url`: an OpenAI-compatible server's models, completions (streamed or not) and /metrics.

The standard library's urllib does the HTTP, so --url needs no client package beyond the base install."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

from ..errors import DflashError
from .stats import parse_counters

TIMEOUT_S = 600


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
        """The server's spec-decode counters (stats.parse_counters), or None where it has no /metrics."""
        try:
            with self._open("/metrics", timeout=10) as resp:
                return parse_counters(resp.read().decode("utf-8", "replace"))
        except DflashError:
            return None

    def complete(self, path: str, body: dict, on_text=None) -> dict:
        """POST a (streamed, when on_text is given) request; returns {text, finish_reason, usage, dflash, ttft_s,
        elapsed_s}. Ctrl-C closes the connection, which stops the generation on the server."""
        chat = path.endswith("/chat/completions")
        body = {"model": self.model, **body, "stream": on_text is not None}
        if on_text is not None:
            body["stream_options"] = {"include_usage": True}  # vLLM and SGLang send a stream's usage only when asked
        t0 = time.perf_counter()
        out = {"text": "", "finish_reason": None, "usage": None, "dflash": None, "ttft_s": None}
        with self._open(path, body) as resp:
            if on_text is None:
                data = json.load(resp)
                choice = (data.get("choices") or [{}])[0]
                out.update(text=(choice.get("message") or {}).get("content") or "" if chat else choice.get("text", ""),
                           finish_reason=choice.get("finish_reason"), usage=data.get("usage"),
                           dflash=data.get("dflash"))
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
