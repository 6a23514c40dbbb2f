"""The generation driver: prefill, then decoder steps until a stop id, max_tokens or a full context.

A decoder is the strategy for one step (plain: one token; speculative: a
verified span). The driver owns stopping, truncation, timing and the session
invariant, so every decoder gets them identically.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from .. import tuning
from ..errors import DflashError
from .sampling import SamplingParams, accept_mode, begin, sample
from .graphs import Fed, Totals
from .session import Session, elapsed, mark, now, read_later


@dataclass
class Step:
    emitted: list[int]  # tokens committed by this step, in order
    draft: list[int] = field(default_factory=list)  # what the drafter proposed
    accepted: int = 0  # how many drafts the target accepted
    # Device marks (session.mark) at the start, after drafting, after verifying: read when the times are,
    # so timing a step never makes it wait for the device.
    marks: tuple = (0.0, 0.0, 0.0)

    @property
    def draft_s(self) -> float:
        return elapsed(self.marks[0], self.marks[1])

    @property
    def verify_s(self) -> float:
        return elapsed(self.marks[1], self.marks[2])


class Decoder(Protocol):
    kind: str

    def prefill(self, session: Session, ids: list[int]) -> torch.Tensor: ...

    def step(self, session: Session, last: int, budget: int, params: SamplingParams) -> Step: ...

    def sync(self, session: Session) -> None: ...


class PlainDecoder:
    """One target forward per token.

    Queue-ahead (the default on CUDA: the `queue_ahead` knob) a step also queues the next step's forward, fed the token it just
    sampled on the device, before it waits for that token: the GPU computes token t+1 while the host reads
    token t, streams it and checks the stop conditions. A queued forward nobody asks for (the generation
    stopped) is dropped; the cache row it wrote is the last emitted token's own, written again when that
    token is forwarded."""

    kind = "none"

    def __init__(self, queue_ahead: bool | None = None):
        self.queue_ahead = queue_ahead  # None: on CUDA, unless the knob is off (on CPU it would just run first)
        # (position, the sampled token as a device tensor, whether it can be read in place, its Fed handle or None)
        # of a queued forward
        self._ahead = None
        # On CUDA the previous step's end mark is this step's start: nothing is queued on the device between them,
        # and each event recorded between two graphs costs the stream a few µs. (On CPU the marks are wall times,
        # and the host's work between steps is not the step's.)
        self._end = None

    def prefill(self, session: Session, ids: list[int]) -> torch.Tensor:
        self._ahead = self._end = None
        return session.forward(ids).logits[-1]

    def step(self, session: Session, last: int, budget: int, params: SamplingParams) -> Step:
        cuda = session.device.type == "cuda"
        t0 = self._end if self._end is not None and cuda else mark(session.device)
        after = None  # a mark after the work that wrote the token, where it can be read in place
        if self._ahead is not None and self._ahead[0] == session.length:
            session.length += 1  # `last` went through the queued forward: commit it
            tok, in_place, fed = self._ahead[1:]
            after = self._end if in_place and cuda else None
        else:
            tok, _, fed = self._next(session, [last], params)
        self._ahead = None
        ahead = cuda and tuning.KNOBS.queue_ahead if self.queue_ahead is None else self.queue_ahead
        # Queued before the next forward, so reading it waits for this step's token only.
        value = read_later(tok.view(1), after)
        if ahead and budget > 1 and session.length + 1 < session.max_len:
            at = session.length
            nxt = self._next(session, fed if fed is not None else tok.view(1), params)  # the next step's; committed when used
            session.length = at
            self._ahead = (at, *nxt)
        t1 = self._end = mark(session.device)
        return Step(emitted=value(), marks=(t0, t0, t1))  # the step's one host sync

    @staticmethod
    def _next(session: Session, ids, params: SamplingParams) -> tuple[torch.Tensor, bool, Fed | None]:
        """The token after a one-row forward of `ids`, on the device (greedy or sampled: the verdict inside the step's
        graph), whether it stays where it is until read (a graph's own output does not: its next replay overwrites
        it), and its handle where the graph fed it on to the next step (Session.fed_token): forwarding that continues
        it."""
        at = session.length
        out = session.forward(ids, accept=accept_mode(params))
        fed = session.fed_token(at)
        return (fed.token, True, fed) if fed is not None else (out.verdict[1], False, None)

    def sync(self, session: Session) -> None:
        self._ahead = self._end = None


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    stop_ids: Sequence[int] = ()


@dataclass
class Result:
    tokens: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    ttft_s: float
    decode_s: float
    steps: list[Step]
    draft_kind: str = "none"
    context_full: bool = False
    interrupted: bool = False
    graph_captures: int = 0  # CUDA graphs captured during this generation (none, once every shape is built)
    first_token_unix_s: float = 0.0  # wall clock (time.time()) when the first token was known: start-up figures

    @property
    def decode_tok_per_s(self) -> float:
        # Tokens after the first, over the time after the first.
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def stats(self) -> dict:
        from .stats import step_stats

        return {
            "ttft_s": round(self.ttft_s, 6),
            "decode_s": round(self.decode_s, 6),
            "decode_tok_per_s": round(self.decode_tok_per_s, 3),
            "steps": len(self.steps),
            "draft_kind": self.draft_kind,
            "graph_captures": self.graph_captures,
            "first_token_unix_s": round(self.first_token_unix_s, 3),
            **step_stats(self.steps),
        }


def check_fits(session: Session, n_prompt: int, max_tokens: int) -> None:
    if max_tokens < 1:
        raise DflashError(f"--max-tokens must be >= 1 (got {max_tokens})")
    need = len(session.pending) + n_prompt
    if need + 1 > session.room() + len(session.pending):
        raise DflashError(
            f"prompt is {n_prompt} tokens but only {session.room() - 1} fit in the context of {session.max_len}"
        )


def generate(
    session: Session,
    decoder: Decoder,
    req: Request,
    on_step: Callable[[Step], None] | None = None,
) -> Result:
    """Run one generation. Ctrl-C (KeyboardInterrupt) ends it early but keeps the session usable."""
    if not req.prompt_ids and not session.pending:
        raise DflashError("the prompt is empty")  # nothing to condition the first token on
    check_fits(session, len(req.prompt_ids), req.max_tokens)
    stops = set(req.stop_ids)
    sampler = begin(req.params, session.device)  # the params on the device, the RNG seeded; None when greedy
    tokens: list[int] = []
    steps: list[Step] = []
    old_pending = session.pending
    ids = old_pending + list(req.prompt_ids)
    session.pending = []
    base = session.length + len(ids)  # committed length once the prompt is in
    captures = Totals.captures
    t_start = now(session.device)
    ttft = decode_s = first_unix = 0.0
    t_decode = None
    finish, context_full, interrupted = "length", False, False
    try:
        logits = decoder.prefill(session, ids)
        first = int(sample(logits, req.params, sampler).item())
        ttft = now(session.device) - t_start
        first_unix = time.time()
        first_step = Step(emitted=[first], marks=(0.0, 0.0, ttft))
        tokens.append(first)
        if on_step:
            on_step(first_step)
        t_decode = now(session.device)
        while True:
            if tokens[-1] in stops:
                finish = "stop"
                break
            budget = req.max_tokens - len(tokens)
            if budget <= 0:
                break
            if session.length + 1 >= session.max_len:
                context_full = True
                break
            budget = min(budget, session.max_len - session.length - 1)
            step = decoder.step(session, tokens[-1], budget, req.params)
            step.emitted = _cut(step.emitted, budget, stops)
            tokens.extend(step.emitted)
            steps.append(step)
            if on_step:
                on_step(step)
    except KeyboardInterrupt:
        interrupted = True
    if t_decode is not None:  # an interrupted generation keeps its real decode time (and so its tok/s)
        decode_s = now(session.device) - t_decode
    if tokens:
        # Every emitted token but the last is in the cache; the last is pending.
        session.length = base + len(tokens) - 1
        session.pending = tokens[-1:]
    else:
        # Interrupted before any output: as if the prompt had never been sent.
        session.length = base - len(ids)
        session.pending = old_pending
    decoder.sync(session)
    return Result(
        tokens=tokens,
        finish_reason=finish,
        prompt_tokens=len(req.prompt_ids),
        ttft_s=ttft,
        decode_s=decode_s,
        steps=steps,
        draft_kind=decoder.kind,
        context_full=context_full,
        interrupted=interrupted,
        graph_captures=Totals.captures - captures,
        first_token_unix_s=first_unix,
    )


def _cut(emitted: list[int], budget: int, stops: set[int]) -> list[int]:
    """Truncate a step's tokens at max_tokens and just after the first stop id."""
    emitted = emitted[:budget]
    for i, tok in enumerate(emitted):
        if tok in stops:
            return emitted[: i + 1]
    return emitted
