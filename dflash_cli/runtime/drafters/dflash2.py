"""The DFlash 2 drafter's runtime: DFlash's (one forward per step over the cached context rows), with the candidate
selector's walk inside the draft step, so that its graph gives the drafts themselves, greedy or sampled."""

from __future__ import annotations

import torch

from ...errors import DflashError
from ...models.dflash2 import DFlash2Drafter
from ..graphs import upload
from .. import sampling
from ..sampling import SamplingParams
from .dflash import DFlashProposer


class DFlash2Proposer(DFlashProposer):
    kind = "dflash2"

    def __init__(self, model: DFlash2Drafter):
        super().__init__(model)
        width = min(sampling.K_MAX, model.cfg.vocab_size)  # the narrowest q buffer (sampling.Sampler.q)
        if model.use_selector and model.selector.top_k > width:
            raise DflashError(f"DFlash 2 drafter: selector_top_k {model.selector.top_k} is more than the "
                              f"{width} candidates a sampled draft's q row holds")

    def propose(self, last: int, k: int, params: SamplingParams):
        mode = sampling.mode(params)
        block = self._full_block(last)
        if self.fast is not None:
            out = self.fast(block, self.ctx_len, *(() if mode is None else (mode,)))
        else:
            out = self._block(upload(block, self.model.device), self._block_span(len(block)), mode)
        return (out[:k], None) if mode is None else self._proposal(out, mode, k)

    def draft_logits(self, last: int, n_draft: int) -> torch.Tensor:
        """The block's logits [n_draft, V] after `last` (eager: a measurement, not a step)."""
        block = self._full_block(last)
        return self.model.block_logits(upload(block, self.model.device), self._block_span(len(block)))[:n_draft]

    def _block(self, ids: torch.Tensor, span, mode: str | None = None) -> torch.Tensor:
        """The block's drafts [k]: the selector's walk (greedy: argmax; sampled: drawn at the sampler's temperature,
        its rows written to the sampler's q buffer, where the verify's block verification reads them)."""
        if mode is None:
            return self.model.draft(ids, span)[0]
        s = sampling.sampler(ids.device)
        # draw: one row's race (the torch walk); noise: the whole block's Exp(1) noise at once, from the same
        # generator (the GPU's one-kernel walk races each row on its row of it).
        drafts, (candidates, probs) = self.model.draft(
            ids, span, s.temperature, lambda q: sampling.race(q, s.gen),
            lambda shape: sampling.race_noise(shape, ids.device, s.gen))
        s.write_q(mode, self.model.cfg.vocab_size, sampling.Filtered(candidates, probs))
        return drafts

    def _tokens(self, out: torch.Tensor) -> torch.Tensor:
        return out  # the greedy step's output is its drafts
