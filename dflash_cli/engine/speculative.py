"""The speculative step, one optimistic transaction for any drafter:
propose k tokens -> verify [last, drafts...] in one target forward -> accept the
longest agreeing prefix plus one target token -> commit their KV, roll back the rest.

Greedy acceptance keeps output identical to plain greedy decoding; with
temperature > 0, rejection sampling keeps the target's distribution.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .generation import Step
from .sampling import SamplingParams, accept_greedy, accept_sampled, probabilities
from .session import Session, now


class Proposer(Protocol):
    kind: str
    capture: tuple[int, ...]  # target hidden-state indices the drafter is conditioned on
    max_draft: int  # most tokens one proposal can hold

    def reset(self, max_len: int, path: str = "eager") -> None:
        """Start a session of max_len positions; path is the session's ("eager", "static", "graphs")."""

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        """Learn committed target positions [start, start+n): their hidden states and token ids."""

    def propose(self, last: int, k: int, params: SamplingParams, gen) -> tuple[list[int], torch.Tensor | None]:
        """k draft tokens following `last` (at the committed end), and their [k, V] probabilities when sampling."""

    def rollback(self, length: int) -> None: ...


class SpeculativeDecoder:
    def __init__(self, proposer: Proposer, draft_len: int | None = None):
        self.proposer = proposer
        self.kind = proposer.kind
        self.draft_len = min(draft_len or proposer.max_draft, proposer.max_draft)
        self._max_len = 0

    def _ensure(self, session: Session) -> None:
        if self._max_len != session.max_len or session.length == 0:
            self.proposer.reset(session.max_len, session.path)
            self._max_len = session.max_len

    def prefill(self, session: Session, ids: list[int]) -> torch.Tensor:
        self._ensure(session)
        start = session.length
        out = session.forward(ids, capture=self.proposer.capture)
        self.proposer.absorb(out.hidden, start, list(ids))
        return out.logits[-1]

    def step(self, session: Session, last: int, budget: int, params: SamplingParams, gen) -> Step:
        start = session.length
        # Verify writes positions [start, start+k]: shrink k near the end of the cache and of max_tokens
        # (k = budget, not budget-1, keeps block sizes identical to z-lab's reference loop).
        k = max(0, min(self.draft_len, budget, session.max_len - start - 1))
        t0 = now(session.device)
        drafts, q = self.proposer.propose(last, k, params, gen) if k else ([], None)
        t1 = now(session.device)
        out = session.forward([last] + drafts, capture=self.proposer.capture, all_logits=True)
        d = torch.tensor(drafts, dtype=torch.long, device=session.device)
        n, bonus = self.accept(d, q, out.logits, params, gen)
        session.length = start + n + 1  # roll back the rejected drafts' KV
        hidden = out.hidden[: n + 1] if out.hidden is not None else None  # None: a proposer that needs no states
        self.proposer.absorb(hidden, start, [last] + drafts[:n])
        t2 = now(session.device)
        return Step(emitted=drafts[:n] + [bonus], draft=drafts, accepted=n, draft_s=t1 - t0, verify_s=t2 - t1)

    def accept(self, drafts: torch.Tensor, q, logits: torch.Tensor, params: SamplingParams, gen) -> tuple[int, int]:
        """(accepted drafts, the target's next token) from the verify logits [k+1, V]."""
        if params.greedy:
            return accept_greedy(drafts, logits)
        return accept_sampled(drafts, q, probabilities(logits, params), gen)

    def sync(self, session: Session) -> None:
        self.proposer.rollback(session.length)
