"""The server's one door into the engine: load the model once, run one request at a time.

Everything the server needs from `dflash_cli.runtime` (and the loaders) is imported here and nowhere else in
`dflash_cli.serve`. Between requests the session keeps the previous request's tokens in the KV cache, exactly
as `dflash chat` keeps a conversation (engine Session: `length` committed + `pending`): a prompt that starts
with them prefills only its new part; one that shares a shorter prefix rolls the cache back to it.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..runtime.decoders import check_draft_len, make_decoder
from ..runtime.generation import Request, generate
from ..runtime.sampling import SamplingParams
from ..runtime.session import Session
from ..runtime.stop_text import StopText
from ..runtime.warmup import prepare
from ..errors import DflashError
from ..runtime.bundle import open_bundle
from ..registry import Registry

CPU_DEFAULT_CONTEXT = 4096


class _Stop(KeyboardInterrupt):
    """Raised from the step hook to end a generation early: `generate` handles it like Ctrl-C, keeping
    the tokens so far and the session consistent."""


@dataclass(eq=False)  # jobs are compared (and hashed) by identity
class Job:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    on_text: Callable[[str], None] | None = None  # called on the worker thread with each new piece of text
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class Outcome:
    text: str
    tokens: list[int]  # every generated id, a final stop id included
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int
    finish_reason: str | None  # "stop" | "length"; None when cancelled
    stats: dict
    steps: list


class Engine:
    """Target + drafter + one session, loaded once. `run` is called from one worker thread at a time."""

    def __init__(self, model: str | None, draft: str | None, draft_len: int | None, device: str | None,
                 dtype: str | None, context: int | None = None):
        self.entry = Registry.load().resolve(model)
        self.bundle = open_bundle(self.entry, device, dtype)
        limit = self.bundle.context_limit()
        context = context or (min(limit, CPU_DEFAULT_CONTEXT) if self.bundle.device.type == "cpu" else limit)
        if context < 16 or context > limit:
            raise DflashError(f"--context must be between 16 and {limit} (got {context})")
        self.tokenizer = self.bundle.tokenizer
        self.decoder = make_decoder(self.bundle, draft, draft_len)
        check_draft_len(self.decoder, draft_len)  # as generate and chat: more than the drafter proposes is an error
        self.session = Session(self.bundle.load_model(), context)
        prepare(self.session, self.decoder, self.bundle.sampling(None, None, None, None), switchable=True,
                notice=lambda text: print(text, file=sys.stderr, flush=True))
        self.history: list[int] = []  # the tokens the session holds: committed ones, then pending

    @property
    def context(self) -> int:
        return self.session.max_len

    @property
    def draft_kind(self) -> str:
        return self.decoder.kind

    @property
    def draft_len(self) -> int:
        return getattr(self.decoder, "draft_len", 0)

    def sampling(self, temperature, top_p, top_k, seed) -> SamplingParams:
        """Request values first, then the model's recommended defaults (raises DflashError on bad values)."""
        return self.bundle.sampling(temperature, top_p, top_k, seed)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode_chat(self, messages: list[dict], think: bool | None) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.render_chat(messages, think=think))

    def run(self, job: Job) -> Outcome:
        tok = self.tokenizer
        stop_ids = set(tok.stop_ids)
        text = StopText(lambda ids: tok.decode(ids), job.stop)
        ids, cached = self._reuse(job.prompt_ids)
        fed = len(self.session.pending) + len(ids)

        def on_step(step):
            piece = text.push([t for t in step.emitted if t not in stop_ids])
            if piece and job.on_text:
                job.on_text(piece)
            if text.hit or job.cancelled.is_set():
                raise _Stop

        budget = max(1, min(job.max_tokens, self.context - len(job.prompt_ids)))
        req = Request(prompt_ids=ids, params=job.params, max_tokens=budget,
                      stop_ids=() if job.ignore_eos else tok.stop_ids)
        try:
            result = generate(self.session, self.decoder, req, on_step=on_step)
        except BaseException:
            self._forget()
            raise
        if result.tokens:
            self.history = list(job.prompt_ids) + result.tokens
        else:  # stopped before the first token: the session is as `_reuse` left it
            self.history = list(job.prompt_ids[: self.session.length]) + self.session.pending
        tail = text.finish()
        if tail and job.on_text and not job.cancelled.is_set():
            job.on_text(tail)
        if job.cancelled.is_set() and not text.hit:
            finish = None
        elif text.hit or result.finish_reason == "stop":
            finish = "stop"
        else:
            finish = "length"
        tokens = text.tokens_through(result.tokens, stop_ids)
        return Outcome(text=text.text, tokens=tokens, completion_tokens=len(tokens),
                       prompt_tokens=len(job.prompt_ids), cached_tokens=cached, finish_reason=finish,
                       steps=result.steps, stats=self._stats(result, fed, cached))

    def _stats(self, result, fed: int, cached: int) -> dict:
        """The `dflash` field of a response."""
        st = result.stats()
        return {
            "draft": self.draft_kind,
            "draft_len": self.draft_len,
            "tau": st["mean_accepted"],  # mean tokens committed per step
            "accepted_length_histogram": st["accept_hist"],  # steps by accepted drafts (index 0, 1, ...)
            "acceptance_by_position": st["accept_by_position"],
            "steps": st["steps"],
            "decode_tokens_per_s": st["decode_tok_per_s"],
            "ttft_s": st["ttft_s"],
            "decode_s": st["decode_s"],
            "prefill_tokens": fed,
            "cached_tokens": cached,
        }

    def _reuse(self, prompt: list[int]) -> tuple[list[int], int]:
        """Leave in the session the longest prefix of `prompt` it already holds; returns (the ids still to feed
        after the session's pending tokens, how many prompt tokens are already in the cache)."""
        s, held = self.session, self.history
        common = 0
        for a, b in zip(held, prompt):
            if a != b:
                break
            common += 1
        if common == len(held) and held and (len(prompt) > common or s.pending):
            return list(prompt[common:]), s.length  # the chat case: the new prompt extends what is held
        keep = min(common, s.length, len(prompt) - 1)  # at least one prompt token is fed, for its logits
        if not s.can_roll_back(keep):
            keep = 0  # a hybrid target's recurrent state holds no older prefix: feed the whole prompt
        s.length, s.pending = keep, []
        if keep:
            self.decoder.sync(s)  # the drafter rolls back with the target (from 0, its prefill starts it afresh)
        self.history = list(prompt[:keep])
        return list(prompt[keep:]), keep

    def _forget(self) -> None:
        self.session.reset()  # the next prefill starts the drafter afresh too
        self.history = []
