"""EAGLE-3 proposer: k chained drafter steps, each feeding its own output state forward."""

from __future__ import annotations

import torch

from ...models.eagle3 import Eagle3Drafter
from ..sampling import SamplingParams, draw, probabilities

MAX_CHAIN = 16  # beyond this a chain's later positions are almost never accepted


class Eagle3Proposer:
    kind = "eagle3"
    prefix_drafts = True  # a chain's first k drafts do not depend on how long it runs

    def __init__(self, drafter: Eagle3Drafter):
        self.drafter = drafter
        self.capture = drafter.capture
        self.max_draft = MAX_CHAIN

    def reset(self, max_len: int, path: str = "eager") -> None:
        self.drafter.reset(max_len, path)

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        self.drafter.absorb(hidden, start, tokens)

    def queues_ahead(self, params: SamplingParams) -> bool:
        """propose_after needs the device-position chain (graphs or static path), which is greedy."""
        return self.drafter.fast is not None and params.greedy

    def propose_after(self, hidden: torch.Tensor, ids: torch.Tensor, start: int, accepted: torch.Tensor,
                      bonus: torch.Tensor, k: int, params: SamplingParams, gen):
        """absorb + propose of the next step, queued before the host reads this step's outcome."""
        return self.drafter.chain_after(hidden, ids, start, accepted, bonus, k), None

    def commit(self, length: int) -> None:
        self.drafter.commit(length)

    def propose(self, last: int, k: int, params: SamplingParams, gen):
        d = self.drafter
        if params.greedy:
            return d.greedy_chain(last, k), None
        pos, state = d.first_state()
        token, drafts, rows = last, [], []
        for _ in range(k):
            logits, state = d.chain_step(pos, state, token)
            # The draft head covers a subset of the vocabulary: q is zero elsewhere.
            q = logits.new_zeros(d.c.vocab)
            q[d.draft_to_target] = probabilities(logits, params)
            rows.append(q)
            token = draw(q, gen).view(1)  # stays on the device for the next chained step
            drafts.append(token)
            pos += 1
        return torch.cat(drafts), torch.stack(rows)

    def rollback(self, length: int) -> None:
        self.drafter.rollback(length)
