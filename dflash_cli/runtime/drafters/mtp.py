"""The MTP drafter's runtime: the chained proposer (chain.py) over the target's final normed states, the MTP layer
fed its own normed output at each chained step (models/mtp.py)."""

from __future__ import annotations

from ...models.mtp import MtpDrafter
from .chain import ChainProposer

# Drafts a proposal holds unless --draft-len says otherwise: the MTP is trained to predict one token ahead, and each
# chained step feeds it its own output instead of the target's state, so later drafts are accepted less often.
DEFAULT_CHAIN = 3


class MtpProposer(ChainProposer):
    kind = "mtp"
    model: MtpDrafter

    @property
    def default_draft(self) -> int:
        return DEFAULT_CHAIN
