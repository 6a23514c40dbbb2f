"""EAGLE-3 proposer: k chained drafter steps, each feeding its own output state forward."""

from __future__ import annotations

import torch

from ...models.eagle3 import Eagle3Drafter
from ..sampling import SamplingParams

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
        """propose_after needs the device-position chain (graphs or static path); drafts are greedy at any
        temperature."""
        return self.drafter.fast is not None

    def propose_after(self, hidden: torch.Tensor, ids: torch.Tensor, start: int, accepted: torch.Tensor,
                      bonus: torch.Tensor, k: int, params: SamplingParams, gen):
        """absorb + propose of the next step, queued before the host reads this step's outcome."""
        return self.drafter.chain_after(hidden, ids, start, accepted, bonus, k), None

    def commit(self, length: int) -> None:
        self.drafter.commit(length)

    def propose(self, last: int, k: int, params: SamplingParams, gen):
        """The greedy chain at any temperature: q is one-hot at the drafts (None), verified exactly by
        accept_sampled; the chain is then the fast one (one graph on the GPU) and queues ahead at any temperature."""
        return self.drafter.greedy_chain(last, k), None

    def rollback(self, length: int) -> None:
        self.drafter.rollback(length)
