"""What the speculative step asks of a drafter, whatever its kind: the complete interface, with the defaults of a
drafter that cannot queue its proposal ahead of the host."""

from __future__ import annotations

import torch

from ..sampling import SamplingParams


class Drafter:
    """A drafter's runtime: its network (`model`) and the state it keeps for one session (caches, the context length
    it has absorbed, its graphs).

    Queue-ahead: a drafter that `can_queue_ahead` proposes the next step's drafts (`propose_ahead`) before the host
    has read how the current verify ended; the host then names the committed length (`commit`)."""

    kind: str
    capture: tuple[int, ...]  # target hidden-state indices the drafter is conditioned on
    max_draft: int  # most tokens one proposal can hold
    # True where a shorter proposal's drafts are the first of a longer one's (a chain drafted token by token): near
    # max_tokens a queued full-length proposal then serves a step that verifies fewer.
    prefix_drafts = False

    @property
    def default_draft(self) -> int:
        """Tokens a proposal holds unless the registry or --draft-len says otherwise."""
        return self.max_draft

    def reset(self, max_len: int, path: str = "eager") -> None:
        """Start a session of max_len positions; path is the session's ("eager", "static", "graphs")."""
        raise NotImplementedError

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        """Learn committed target positions [start, start+n): their hidden states and token ids."""
        raise NotImplementedError

    def propose(self, last: int, k: int, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k >= 1 draft tokens following `last` (at the committed end) as a long device tensor [k], and when sampling
        their q rows (a sampling.Filtered [k]: the sampler's buffer, which the verify's acceptance reads; written
        inside the proposal's graph). Nothing may wait for the device here."""
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        """Forget everything past the committed length."""
        raise NotImplementedError

    def absorbs_verified(self) -> bool:
        """Whether absorb_verified works (the device-position path)."""
        return False

    def absorb_verified(self, hidden: torch.Tensor, ids: torch.Tensor, start: int) -> None:
        """Absorb every verified row (states `hidden`, tokens `ids`, from position `start`) on the device, the
        rejected ones included (later absorbs overwrite them), so that every step has one shape. The committed length
        stays where it was until `commit` names it."""
        raise NotImplementedError

    def can_queue_ahead(self, params: SamplingParams) -> bool:
        """Whether propose_ahead works on this session's path with these params."""
        return False

    def propose_ahead(self, hidden: torch.Tensor, ids: torch.Tensor, start: int, accepted: torch.Tensor,
                      bonus: torch.Tensor, k: int, params: SamplingParams):
        """Absorb every verified row (states `hidden`, tokens `ids`, from position `start`) and propose k drafts after
        `bonus` at start + accepted + 1 (`accepted`, `bonus`: device scalars), without waiting for the device."""
        raise NotImplementedError

    def commit(self, length: int) -> None:
        """The committed length, once the host has read it (after propose_ahead)."""
        raise NotImplementedError
