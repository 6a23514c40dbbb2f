"""DFlash proposer: one drafter forward per step fills the whole block."""

from __future__ import annotations

import torch

from ...models.dflash import DFlashDrafter
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

    def propose(self, last: int, k: int, params: SamplingParams, gen):
        logits = self.drafter.draft_logits(last, k)
        if params.greedy:
            return logits.argmax(-1), None
        q = probabilities(logits, params)
        return draw(q, gen), q

    def rollback(self, length: int) -> None:
        self.drafter.rollback(length)
