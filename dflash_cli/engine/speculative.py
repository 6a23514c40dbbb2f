"""The speculative step, one optimistic transaction for any drafter:
propose k tokens -> verify [last, drafts...] in one target forward -> accept the
longest agreeing prefix plus one target token -> commit their KV, roll back the rest.

Greedy acceptance keeps output identical to plain greedy decoding; with
temperature > 0, rejection sampling keeps the target's distribution.

Drafts, the verify input and the acceptance stay on the device: a step waits for
it once, to bring back the accepted count, the bonus and the drafts together.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .generation import Step
from .graphs import upload
from .sampling import SamplingParams, accept_greedy, accept_sampled, probabilities
from .session import Session, mark


class Proposer(Protocol):
    kind: str
    capture: tuple[int, ...]  # target hidden-state indices the drafter is conditioned on
    max_draft: int  # most tokens one proposal can hold

    def reset(self, max_len: int, path: str = "eager") -> None:
        """Start a session of max_len positions; path is the session's ("eager", "static", "graphs")."""

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        """Learn committed target positions [start, start+n): their hidden states and token ids."""

    def propose(self, last: int, k: int, params: SamplingParams, gen) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k >= 1 draft tokens following `last` (at the committed end) as a long device tensor [k], and
        their [k, V] probabilities when sampling. Nothing may wait for the device here."""

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
        start, dev = session.length, session.device
        # Verify writes positions [start, start+k]: shrink k near the end of the cache and of max_tokens
        # (k = budget, not budget-1, keeps block sizes identical to z-lab's reference loop).
        k = max(0, min(self.draft_len, budget, session.max_len - start - 1))
        t0 = mark(dev)
        head = upload([last], dev)
        drafts, q = self.proposer.propose(last, k, params, gen) if k else (head[:0], None)
        t1 = mark(dev)
        out = session.forward(torch.cat([head, drafts]), capture=self.proposer.capture, all_logits=True)
        n, bonus = self.accept(drafts, q, out.logits, params, gen)
        # The step's one host sync: everything the host needs from the device, in one transfer.
        n, bonus, *draft = torch.cat([n.view(1), bonus.view(1), drafts]).tolist()
        session.length = start + n + 1  # roll back the rejected drafts' KV
        hidden = out.hidden[: n + 1] if out.hidden is not None else None  # None: a proposer that needs no states
        self.proposer.absorb(hidden, start, [last] + draft[:n])
        return Step(emitted=draft[:n] + [bonus], draft=draft, accepted=n, marks=(t0, t1, mark(dev)))

    def accept(self, drafts: torch.Tensor, q, logits: torch.Tensor, params: SamplingParams, gen):
        """(accepted drafts, the target's next token) from the verify logits [k+1, V], as device scalars."""
        if params.greedy:
            return accept_greedy(drafts, logits)
        return accept_sampled(drafts, q, probabilities(logits, params), gen)

    def sync(self, session: Session) -> None:
        self.proposer.rollback(session.length)
