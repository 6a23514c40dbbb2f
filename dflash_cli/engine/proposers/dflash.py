"""DFlash proposer: one drafter forward per step fills the whole block."""

from __future__ import annotations

import torch

from ...models.dflash import DFlashDrafter
from .. import ops
from ..sampling import SamplingParams, draw, probabilities


class DFlashProposer:
    kind = "dflash"

    def __init__(self, drafter: DFlashDrafter):
        self.drafter = drafter
        self.capture = drafter.capture
        self.max_draft = drafter.block_size - 1

    def reset(self, max_len: int, path: str = "eager") -> None:
        self.drafter.reset(max_len, path)

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        self.drafter.absorb(hidden, start)

    def queues_ahead(self, params: SamplingParams) -> bool:
        """Whether propose_after works: it needs the device-position forward (graphs or static path)."""
        return self.drafter.fast is not None

    def propose(self, last: int, k: int, params: SamplingParams, gen):
        return self._drafts(self.drafter.draft_logits(last, k), params, gen)

    def propose_after(self, hidden: torch.Tensor, ids: torch.Tensor, start: int, accepted: torch.Tensor,
                      bonus: torch.Tensor, k: int, params: SamplingParams, gen):
        """absorb + propose of the next step, queued before the host reads this step's outcome."""
        return self._drafts(self.drafter.draft_after(hidden, start, accepted, bonus, k), params, gen)

    def commit(self, length: int) -> None:
        self.drafter.commit(length)

    @staticmethod
    def _drafts(logits: torch.Tensor, params: SamplingParams, gen):
        if params.greedy:
            return ops.argmax_rows(logits), None
        q = probabilities(logits, params)
        return draw(q, gen), q

    def rollback(self, length: int) -> None:
        self.drafter.rollback(length)
