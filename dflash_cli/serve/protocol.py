"""OpenAI request bodies -> validated values, and OpenAI-style errors (`{"error": {message, type, param, code}}`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..runtime.sampling_ranges import SEED_MAX, SEED_MIN, TOP_K_MAX


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class GenParams:
    """What both endpoints share, checked; sampling values stay None where the request left them out."""

    model: str | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def _number(body, name, kind, low=None, high=None, low_open=False):
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and ok:
        ok = float(value).is_integer()
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = "" if low is None else f" ({'>' if low_open else '>='} {low}{'' if high is None else f', <= {high}'})"
        raise ApiError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}{bounds}; got {value!r}",
                       param=name, code="invalid_value")
    return kind(value)


UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "suffix", "tools", "functions", "logit_bias", "presence_penalty",
               "frequency_penalty", "repetition_penalty", "response_format")


def parse_common(body: dict, max_tokens_key: str = "max_tokens") -> GenParams:
    for name in UNSUPPORTED:  # said plainly rather than ignored: the answer would not be what was asked for
        if body.get(name) not in (None, False, 0, [], {}) and body.get(name) != {"type": "text"}:
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model", code="invalid_value")
    for name in ("n", "best_of"):  # best_of: /v1/completions' best of several samples
        if _number(body, name, int, 1) not in (None, 1):
            raise ApiError(400, f"only {name}=1 is supported (batch size 1)", param=name, code="invalid_value")
    max_tokens = _number(body, max_tokens_key, int, 1)
    if max_tokens is None and max_tokens_key == "max_completion_tokens":
        max_tokens = _number(body, "max_tokens", int, 1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop", code="invalid_value")
    if len(stop) > 16:
        raise ApiError(400, "at most 16 stop sequences", param="stop", code="invalid_value")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", param="stream", code="invalid_value")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options", code="invalid_value")
    return GenParams(
        model=model,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", float, 0, 2),
        top_p=_number(body, "top_p", float, 0, 1, low_open=True),
        top_k=_number(body, "top_k", int, -1, TOP_K_MAX),
        seed=_number(body, "seed", int, SEED_MIN, SEED_MAX),
        stop=stop,
        stream=stream,
        include_usage=_flag(options, "include_usage", "stream_options"),
        ignore_eos=_flag(body, "ignore_eos"),
        return_token_ids=_flag(body, "return_token_ids"),
    )


def _flag(body: dict, name: str, param: str | None = None) -> bool:
    """A true/false switch (absent or null: false); a string such as "false" is refused, not taken as true."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false; got {value!r}", param=param or name,
                       code="invalid_value")
    return bool(value)


def completion_prompt(body: dict) -> str | list[int]:
    """A string, a list of token ids, or a list holding one of those (one prompt: batch size 1)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _text(prompt, "'prompt'", "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt)", param="prompt",
                   code="invalid_value")


def chat_messages(body: dict) -> list[dict]:
    """Messages with string content (text parts joined); roles system, user, assistant (developer -> system)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages", code="invalid_value")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise ApiError(400, f"messages[{i}]: role must be system, user or assistant", param="messages",
                           code="invalid_value")
        content = m.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
                raise ApiError(400, f"messages[{i}]: only text content parts are supported", param="messages",
                               code="invalid_value")
            content = "".join(parts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}]: content must be a string", param="messages", code="invalid_value")
        out.append({"role": role, "content": _text(content, f"messages[{i}]: content", "messages")})
    return out


def _text(text: str, what: str, param: str) -> str:
    """JSON's \\uD800 escapes decode to lone surrogates, which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"{what} is not valid Unicode (a lone surrogate at character {exc.start})", param=param,
                       code="invalid_value") from None
    return text


def chat_think(body: dict) -> bool | None:
    """Qwen3's thinking switch, as vLLM and SGLang take it: chat_template_kwargs.enable_thinking."""
    kwargs = body.get("chat_template_kwargs") or {}
    value = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    return value if isinstance(value, bool) else None
