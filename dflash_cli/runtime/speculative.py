"""The speculative step, one optimistic transaction for any drafter:
propose k tokens -> verify [last, drafts...] in one target forward -> accept a
prefix of the drafts plus one target token -> commit their KV, roll back the rest.

Greedy acceptance (the longest agreeing prefix) keeps output identical to plain greedy
decoding; with temperature > 0, block verification (sampling.block_weights) keeps the
target's distribution.

Drafts, the verify input and the acceptance stay on the device: a step waits for
it once, to bring back the accepted count, the bonus and the drafts together.
Where the proposer can (on the graphs path: DFlash, EAGLE-3), the next step's absorb and
proposal are queued before that wait, so the device goes on while the host reads. Sampled or greedy, the
acceptance runs inside the verify's graph (sampled: against the q rows the proposal left in the sampler's buffer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import tuning
from .drafters.base import Drafter
from .generation import Step
from .graphs import upload
from .sampling import SamplingParams, accept_mode
from .session import Session, mark, read_later


@dataclass
class _Queued:
    """A proposal queued by the previous step (see SpeculativeDecoder.step)."""

    start: int  # the committed length it follows
    k: int
    head: torch.Tensor  # [1]: the previous step's bonus token, on the device
    drafts: torch.Tensor
    q: torch.Tensor | None
    marks: tuple  # device marks around the absorb + proposal


class SpeculativeDecoder:
    def __init__(self, proposer: Drafter, draft_len: int | None = None):
        self.proposer = proposer
        self.kind = proposer.kind
        self.draft_len = min(draft_len or proposer.default_draft, proposer.max_draft)
        self._max_len = 0
        self._queued: _Queued | None = None
        # Off (tuning.queue_ahead): absorb and propose only after the read. Greedy tokens are the same either way.
        self.queue_ahead = tuning.KNOBS.queue_ahead
        self._prefix = proposer.prefix_drafts

    def _ensure(self, session: Session) -> None:
        if self._max_len != session.max_len or session.length == 0:
            self.proposer.reset(session.max_len, session.path)
            self._max_len = session.max_len

    def prefill(self, session: Session, ids: list[int]) -> torch.Tensor:
        self._queued = None
        self._ensure(session)
        start = session.length
        out = session.forward(ids, capture=self.proposer.capture)
        self.proposer.absorb(out.hidden, start, list(ids))
        return out.logits[-1]

    def step(self, session: Session, last: int, budget: int, params: SamplingParams) -> Step:
        start, dev = session.length, session.device
        # Verify writes positions [start, start+k]: k shrinks only near the end of the cache. Near max_tokens the
        # step keeps its size (the driver cuts what passes max_tokens), so a generation meets no new graph shape
        # there. (A DFlash block is drafted whole whatever k: z-lab's reference loop shrinks it near its end.)
        k = max(0, min(self.draft_len, session.max_len - start - 1))
        queued, self._queued = self._queued, None
        if queued is not None and queued.start == start and (queued.k == k or queued.k > k and self._prefix):
            # Its draft time includes the absorb; the verify time, any wait for the host before the verify.
            head, drafts, (t0, t1) = queued.head, queued.drafts[:k], queued.marks
            q = queued.q[:k] if queued.q is not None else None
        else:
            t0 = mark(dev)
            head = upload([last], dev)
            drafts, q = self.proposer.propose(last, k, params) if k else (head[:0], None)
            t1 = mark(dev)
        ids = torch.cat([head, drafts])
        # The acceptance runs inside the verify's graph (sampled: against the q rows the proposal wrote).
        out = session.forward(ids, capture=self.proposer.capture, all_logits=True, accept=accept_mode(params))
        verdict = self.accept(ids, q, out, params)
        t2 = mark(dev)
        # The step's one host sync: everything the host needs from the device, in one transfer, queued
        # before the next proposal so that reading it waits for this step only.
        outcome = read_later(verdict)
        n, bonus = verdict[0], verdict[1]
        nxt = self._queue_next(session, out.hidden, ids, start, k, n, bonus, budget, params)
        n, bonus, *draft = outcome()
        session.commit(start + n + 1)  # roll back the rejected drafts' KV (a recurrent state: folded in the step)
        if nxt is not None:
            self.proposer.commit(session.length)
            nxt.start = session.length
            self._queued = nxt
        elif out.hidden is not None and self.proposer.absorbs_verified():
            self.proposer.absorb_verified(out.hidden, ids, start)  # every verified row: one graph shape
            self.proposer.commit(session.length)
        else:
            hidden = out.hidden[: n + 1] if out.hidden is not None else None  # None: a proposer that needs no states
            self.proposer.absorb(hidden, start, [last] + draft[:n])
        return Step(emitted=draft[:n] + [bonus], draft=draft, accepted=n, marks=(t0, t1, t2))

    def _queue_next(self, session: Session, hidden, ids, start: int, k: int, n, bonus, budget: int,
                    params: SamplingParams) -> _Queued | None:
        """The next step's absorb + proposal, queued while the device still verifies this one, so the device
        never waits for the host between steps. Only where its size is already certain: whatever this step
        accepts, the next asks for draft_len drafts unless max_tokens or the cache end is near. If the
        generation stops instead, the queued work is dropped: it wrote only rows past the committed end."""
        if not (k and self.queue_ahead and hidden is not None and self.proposer.can_queue_ahead(params)):
            return None
        most = start + k + 1  # the committed length if every draft is accepted
        if session.max_len - most - 1 < self.draft_len:
            return None  # the next proposal might not fit the cache
        if budget - (k + 1) < 1:  # a next step whatever this step accepts (of draft_len drafts: see `step`)
            return None
        t0 = mark(session.device)
        drafts, q = self.proposer.propose_ahead(hidden, ids, start, n, bonus, self.draft_len, params)
        return _Queued(start=-1, k=self.draft_len, head=bonus.view(1), drafts=drafts, q=q,
                       marks=(t0, mark(session.device)))

    def accept(self, ids: torch.Tensor, q, out, params: SamplingParams) -> torch.Tensor:
        """The verdict on the verified rows `ids` = [last, drafts...] (q: the drafts' rows, a sampling.Filtered, or
        None when greedy): long [2 + k] = [accepted drafts, the target's next token, drafts...] on the device,
        computed with the forward (`Session.forward`'s accept)."""
        return out.verdict

    def sync(self, session: Session) -> None:
        self._queued = None
        self.proposer.rollback(session.length)
