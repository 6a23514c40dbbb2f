"""`dflash generate`: one prompt, one streamed (or JSON) answer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ..drafters import make_decoder
from ..engine.generation import Request, generate
from ..engine.session import Session
from ..errors import DflashError
from ..loading.bundle import open_bundle
from ..registry import Registry
from ..ui.stream import StreamView
from .common import DEFAULT_MAX_TOKENS, read_prompt, sampling_params


@dataclass
class GenerateOptions:
    model: str | None = None
    prompt: str | None = None
    prompt_file: Path | None = None
    system: str | None = None
    raw: bool = False
    think: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int | None = None
    device: str | None = None
    dtype: str | None = None
    json: bool = False
    trace: Path | None = None
    draft: str | None = None
    draft_len: int | None = None
    show_drafts: bool = False
    url: str | None = None  # an OpenAI-compatible server instead of the local engine (dflash_cli/remote.py)
    api_key: str | None = None


def run_generate(o: GenerateOptions, console: Console) -> None:
    if o.url:
        from ..remote import remote_generate

        return remote_generate(o, console)
    text = read_prompt(o.prompt, o.prompt_file)
    if o.max_tokens < 1:
        raise DflashError(f"--max-tokens must be >= 1 (got {o.max_tokens})")
    bundle = open_bundle(Registry.load().resolve(o.model), o.device, o.dtype)
    tok = bundle.tokenizer
    if o.raw:
        if o.system:
            raise DflashError("--system needs the chat template; drop --raw")
        ids = tok.encode(text)
    else:
        messages = ([{"role": "system", "content": o.system}] if o.system else []) + [{"role": "user", "content": text}]
        ids = tok.encode(tok.render_chat(messages, think=o.think))
    if not ids:
        raise DflashError("the prompt is empty")
    limit = bundle.context_limit()
    if len(ids) >= limit:
        raise DflashError(f"prompt is {len(ids)} tokens; the context holds {limit}")
    params = sampling_params(bundle, o.temperature, o.top_p, o.top_k, o.seed)
    trace = _open_trace(o.trace)  # early: a bad path fails before the weights load
    try:
        decoder = make_decoder(bundle, o.draft, o.draft_len)
        # A little room past max_tokens so the last speculative steps keep their full block.
        session = Session(bundle.load_model(), max_len=min(limit, len(ids) + o.max_tokens + 32))
        req = Request(prompt_ids=ids, params=params, max_tokens=o.max_tokens, stop_ids=tok.stop_ids)
        if o.json:
            result = generate(session, decoder, req, on_step=_tracer(trace))
        else:
            with StreamView(console, tok, tok.stop_ids, show_drafts=o.show_drafts) as view:
                result = generate(session, decoder, req, on_step=_tee(view.on_step, _tracer(trace)))
    finally:
        if trace:
            trace.close()
    if o.json:
        visible = [t for t in result.tokens if t not in set(tok.stop_ids)]
        print(json.dumps({
            "text": tok.decode(visible),
            "tokens": result.tokens,
            "prompt_tokens": result.prompt_tokens,
            "finish_reason": result.finish_reason,
            "stats": result.stats(),
        }, ensure_ascii=False))
    if result.interrupted:
        raise KeyboardInterrupt


def _open_trace(path: Path | None):
    if path is None:
        return None
    try:
        return open(Path(path).expanduser(), "w", encoding="utf-8")
    except OSError as exc:
        raise DflashError(f"cannot write trace file {path}: {exc.strerror}") from None


def _tracer(trace):
    if trace is None:
        return None
    counter = iter(range(1 << 62))

    def write(step):
        trace.write(json.dumps({"step": next(counter), "draft": step.draft, "accepted": step.accepted,
                                "emitted": step.emitted}) + "\n")

    return write


def _tee(*fns):
    fns = [f for f in fns if f]
    return lambda step: [f(step) for f in fns]
