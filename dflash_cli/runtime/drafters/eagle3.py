"""The EAGLE-3 drafter's runtime: the chained proposer (chain.py) over the fc-projected target states."""

from __future__ import annotations

from ...models.eagle3 import Eagle3Drafter
from .chain import MAX_CHAIN, ChainProposer

DEFAULT_CHAIN = 7  # a drafter's chain length where neither its config nor the registry names one


class Eagle3Proposer(ChainProposer):
    kind = "eagle3"
    model: Eagle3Drafter

    @property
    def default_draft(self) -> int:
        return min(self.model.c.chain_length or DEFAULT_CHAIN, MAX_CHAIN)
