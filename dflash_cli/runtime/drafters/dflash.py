"""The DFlash drafter's runtime: one drafter forward per step fills the whole block, over a cache of context rows
(the target's states at committed positions) that grows as tokens are committed."""

from __future__ import annotations

import torch

from ...layers import ops
from ...layers.kv_cache import KVCache
from ...layers.spans import MAX_STEP_ROWS, Span, StaticSpan
from ...models.dflash import DFlashDrafter
from ..graphs import Graphs, stage_step, upload
from .. import sampling
from ..sampling import SamplingParams
from .base import Drafter


class DFlashProposer(Drafter):
    """Every proposal drafts the whole block and keeps its first k drafts: the block's rows see each other, so a
    shorter block (fewer mask rows) drafts other, worse tokens than the drafter was trained to (the demo's drafter
    at 7 drafts a step: greedy τ 1.86 from a block of 8 against 2.58 from its block of 16, on the README's prompt)."""

    kind = "dflash"
    prefix_drafts = True  # the first k drafts of a block do not depend on how many of them a step keeps

    def __init__(self, model: DFlashDrafter):
        self.model = model
        self.capture = model.capture
        # A block past a step's rows (MAX_STEP_ROWS, with the anchor) drafts as many as fit: its q rows, the verify
        # graphs and a hybrid's kept rows end there.
        self.max_draft = min(model.block_size, MAX_STEP_ROWS) - 1
        self.cache: KVCache | None = None
        self.graphs = self.fast = self.fast_absorb = None
        self.ctx_len = 0  # target positions whose context rows the cache holds

    def reset(self, max_len: int, path: str = "eager") -> None:
        """(Re)allocate the context cache for a session of `max_len` positions: the block's own rows are written past
        the context, so it holds one block more. path "graphs"/"static": the draft forward and the per-step absorb
        run on device-held positions (runtime/graphs.py)."""
        m, cfg = self.model, self.model.cfg
        rows = max_len + m.block_size
        if self.cache is None or self.cache.max_len < rows:
            self.cache = KVCache.allocate(cfg.num_hidden_layers, rows, cfg.num_key_value_heads, cfg.head_dim,
                                          m.dtype, m.device)
            self.cos, self.sin = ops.rope_tables(cfg.head_dim, cfg.rope_theta, rows, m.device)
            self.graphs = None
        use = path == "graphs"
        # Graphs built for another path (replay vs eager static forward) are rebuilt, not reused.
        if path in ("graphs", "static") and (self.graphs is None or self.graphs[0].requested != use):
            def draft(ids, positions, window, mode=None):
                return self._block(ids, StaticSpan(self.cache, positions, window, self.cos, self.sin, causal=False,
                                                   layer_masks=m.c.layer_masks), mode)

            def absorb(hidden, positions, window):
                span = StaticSpan(self.cache, positions, window, self.cos, self.sin)
                m.context_rows(hidden, span, stacked=True)

            self.graphs = (Graphs(draft, m.device, self.cache.max_len, use),
                           Graphs(absorb, m.device, self.cache.max_len, use))
        self.fast, self.fast_absorb = self.graphs if path in ("graphs", "static") else (None, None)
        self.ctx_len = 0

    def rollback(self, length: int) -> None:
        self.ctx_len = min(self.ctx_len, length)

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int] | None = None) -> None:
        """Append context rows for target positions [start, start+n) (their captured hidden states)."""
        self._check(start)
        n = hidden.shape[0]
        self.model.context_rows(hidden, Span(self.cache, start, n, self.cos, self.sin))
        self.ctx_len = start + n

    def absorbs_verified(self) -> bool:
        return self.fast_absorb is not None

    def absorb_verified(self, hidden: torch.Tensor, ids: torch.Tensor, start: int) -> None:
        self._check(start)
        self.fast_absorb(hidden, start)

    def _check(self, start: int) -> None:
        if start != self.ctx_len:
            raise RuntimeError(f"drafter context out of step: has {self.ctx_len}, got rows from {start}")

    def can_queue_ahead(self, params: SamplingParams) -> bool:
        return self.fast is not None  # the device-position forward (graphs or static path)

    def propose(self, last: int, k: int, params: SamplingParams):
        mode = sampling.mode(params)
        if mode is None:
            return ops.argmax_rows(self.draft_logits(last, k)), None
        block = self._full_block(last)
        if self.fast is not None:
            return self._proposal(self.fast(block, self.ctx_len, mode), mode, k)
        span = self._block_span(len(block))
        return self._proposal(self._block(upload(block, self.model.device), span, mode), mode, k)

    def propose_ahead(self, hidden: torch.Tensor, ids: torch.Tensor, start: int, accepted: torch.Tensor,
                      bonus: torch.Tensor, k: int, params: SamplingParams):
        """Absorbs every verified row [start, start + len(hidden)): the rejected ones are overwritten by the block
        and by later absorbs. Then drafts the block after `bonus`, of which the first k are proposed; until `commit`
        the context counts as ending at `start`."""
        self.absorb_verified(hidden, ids, start)
        mask = self.model.c.mask_token_id

        def block(ids, positions):  # [bonus, masks...] at start + accepted + 1, ...: one kernel
            stage_step(ids, bonus.reshape(1), positions, start + 1, offset=accepted, fill=mask)

        mode = sampling.mode(params)
        extra = () if mode is None else (mode,)
        out = self.fast.staged(self.max_draft + 1, block, *extra)
        return (self._tokens(out)[:k], None) if mode is None else self._proposal(out, mode, k)

    def commit(self, length: int) -> None:
        self.ctx_len = length

    def draft_logits(self, last: int, n_draft: int) -> torch.Tensor:
        """Logits [n_draft, V] for the positions after `last`, which sits at position ctx_len (the whole block's
        first n_draft rows)."""
        block = self._full_block(last)
        if self.fast is not None:
            return self.fast(block, self.ctx_len)[:n_draft]
        span = self._block_span(len(block))
        return self.model.block_logits(upload(block, self.model.device), span)[:n_draft]

    def _full_block(self, last: int) -> list[int]:
        """The block a proposal drafts: `last`, then a mask for each of its max_draft rows."""
        return [last] + [self.model.c.mask_token_id] * self.max_draft

    def _block_span(self, rows: int) -> Span:
        """The eager span of a block at ctx_len: non-causal, or per layer as the drafter's config says."""
        return Span(self.cache, self.ctx_len, rows, self.cos, self.sin, causal=False,
                    layer_masks=self.model.c.layer_masks)

    def _block(self, ids: torch.Tensor, span, mode: str | None = None) -> torch.Tensor:
        """The block's forward at `span`: its draft rows' logits (greedy), or with a sampled mode the drafts drawn
        from them, their q rows written inside (the draft step's graph holds both)."""
        logits = self.model.block_logits(ids, span)
        return logits if mode is None else self._sampled(logits, mode)

    def _tokens(self, out: torch.Tensor) -> torch.Tensor:
        """The greedy drafts of a greedy block's output."""
        return ops.argmax_rows(out)

    def _sampled(self, logits: torch.Tensor, mode: str) -> torch.Tensor:
        """Drafts drawn from the block's filtered rows [k, V], their q rows written to the sampler's buffer (where the
        verify's acceptance reads them): shape-static, inside the draft step's graph."""
        s = sampling.sampler(logits.device)
        buffer = s.q(mode, logits.shape[-1])[: logits.shape[0]]
        return sampling.filtered_draw(logits, mode, s, out=buffer)[0]

    def _proposal(self, drafts: torch.Tensor, mode: str, k: int):
        """The first k of a sampled block's drafts and their q rows."""
        return drafts[:k], sampling.sampler(drafts.device).q(mode, self.model.cfg.vocab_size)[:k]
