"""A chained drafter's runtime (EAGLE-3, MTP): k drafter steps, each feeding its own output state forward, over the
drafter's one-layer cache and the target states it keeps by position.

Row p of the drafter pairs the state at position p with the token at p+1 and drafts the token at p+2. What the network
provides (models/eagle3.Eagle3Drafter, models/mtp.MtpDrafter):

* device, dtype; width (a kept state's features); vocab (the target's); draft_to_target (draft id -> target id, or
  None where the head covers the target's vocabulary);
* new_cache(rows) -> its KVCache; rope_tables(rows) -> (cos, sin) of its attention;
* fuse(hidden): the target's captured states -> the states kept by position;
* rows(span, state, next_ids) -> the rows' outputs (a chained step's next state), writing their KV;
* logits(out) -> head logits of outputs.
"""

from __future__ import annotations

import torch

from ...layers import ops
from ...layers.spans import Span, StaticSpan
from ..graphs import MAX_ROWS, Graphs, host_ids, upload
from .. import sampling
from ..sampling import SamplingParams
from .base import Drafter

MAX_CHAIN = 16  # beyond this a chain's later positions are almost never accepted


class ChainProposer(Drafter):
    prefix_drafts = True  # a chain's first k drafts do not depend on how long it runs

    def __init__(self, model):
        self.model = model
        self.capture = model.capture
        self.max_draft = MAX_CHAIN
        self.cache = None
        self.graphs = self.fast = self.fast_absorb = None
        self.fused: torch.Tensor | None = None  # the kept (fused) target states by position
        self.rows = 0  # drafter rows (positions) whose KV is valid
        self.committed = 0

    def reset(self, max_len: int, path: str = "eager") -> None:
        m = self.model
        rows = max_len + MAX_ROWS  # chained rows run past the committed end (a chain of at most a step's rows)
        if self.cache is None or self.cache.max_len < rows:
            self.cache = m.new_cache(rows)
            self.fused = torch.zeros(rows, m.width, dtype=m.dtype, device=m.device)
            self.cos, self.sin = m.rope_tables(rows)
            self.graphs = None
        use = path == "graphs"
        # Graphs built for another path (replay vs eager static forward) are rebuilt, not reused.
        if path in ("graphs", "static") and (self.graphs is None or self.graphs[0].requested != use):
            self.graphs = (Graphs(self._chain, m.device, self.cache.max_len, use_graphs=use),
                           Graphs(self._absorb_rows, m.device, self.cache.max_len, use_graphs=use))
            self.next_ids = torch.zeros(MAX_ROWS, dtype=torch.long, device=m.device)
            self.offsets = torch.arange(MAX_ROWS, device=m.device)
        self.fast, self.fast_absorb = self.graphs if path in ("graphs", "static") else (None, None)
        self.rows = 0
        self.committed = 0

    def rollback(self, length: int) -> None:
        # Row p needs the token at p+1, so rows up to length-2 stay valid.
        self.committed = min(self.committed, length)
        self.rows = min(self.rows, max(length - 1, 0))

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        """Target states for positions [start, start+m) and the tokens at those positions."""
        if start != self.committed:
            raise RuntimeError(f"{self.kind} drafter out of step: has {self.committed}, got rows from {start}")
        if self.fast_absorb is not None:
            self._absorb_chunks(hidden, start, tokens)
            return
        m = hidden.shape[0]
        self.fused[start : start + m] = self.model.fuse(hidden)
        self.committed = start + m
        # Rows [start-1, start+m-2]: state at p with the token at p+1 (row start-1 waited for tokens[0]).
        first = max(start - 1, 0)
        nxt = upload(tokens[first + 1 - start :], self.model.device)
        if nxt.numel():
            span = Span(self.cache, first, nxt.numel(), self.cos, self.sin)
            self.model.rows(span, self.fused[first : first + nxt.numel()], nxt)
        self.rows = first + nxt.numel()

    def absorbs_verified(self) -> bool:
        return self.fast_absorb is not None and self.committed >= 1

    def absorb_verified(self, hidden: torch.Tensor, ids: torch.Tensor, start: int) -> None:
        if start != self.committed or start < 1:
            raise RuntimeError(f"{self.kind} drafter out of step: has {self.committed}, got rows from {start}")
        self._absorb_fast(hidden, start, ids)

    def can_queue_ahead(self, params: SamplingParams) -> bool:
        return self.fast is not None  # the device-position chain, greedy or sampled

    def propose_ahead(self, hidden: torch.Tensor, ids: torch.Tensor, start: int, accepted: torch.Tensor,
                      bonus: torch.Tensor, k: int, params: SamplingParams):
        """Absorbs every verified row: target states `hidden` at [start, start + m) with their tokens `ids` (the
        verify input, on the device). Rows past the accepted ones pair states with rejected tokens: the chain and
        later absorbs overwrite them, and causal attention hides them from the rows before. Then chains k drafts
        after `bonus`; until `commit` the drafter counts as committed to `start`."""
        self.absorb_verified(hidden, ids, start)
        # The chain's rows sit at committed-1 ... committed+k-2 (committed = start + accepted + 1).
        positions = self.offsets[:k] + (accepted + start)
        mode = sampling.mode(params)
        extra = () if mode is None else (mode,)
        drafts = self.fast(bonus.view(1), start, k, *extra, positions=positions)
        return drafts, self._q(mode, k)

    def commit(self, length: int) -> None:
        self.committed, self.rows = length, length - 1

    def propose(self, last: int, k: int, params: SamplingParams):
        mode = sampling.mode(params)
        if mode is None:
            return self.greedy_chain(last, k), None
        if self.fast is not None:  # one replay, as the greedy chain's
            drafts = self.fast([last], self.committed, k, mode,
                               positions=range(self.committed - 1, self.committed - 1 + k))
            return drafts, self._q(mode, k)
        pos, state = self.first_state()
        token, drafts = last, []
        for i in range(k):
            logits, state = self.chain_step(pos + i, state, token)
            token = self._draw(logits.view(1, -1), mode, i)  # stays on the device for the next chained step
            drafts.append(token)
        return torch.cat(drafts), self._q(mode, k)

    def _to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        d2t = self.model.draft_to_target
        return ids if d2t is None else d2t[ids]

    def _draw(self, logits: torch.Tensor, mode: str, row: int) -> torch.Tensor:
        """A draft (target id [1]) from draft-vocabulary logits [1, Vd], its q row (over target ids: a draft head
        over a subset of the vocabulary has q 0 elsewhere) written to row `row` of the sampler's buffer."""
        s = sampling.sampler(logits.device)
        buffer = s.q(mode, self.model.vocab)[row : row + 1]
        return sampling.filtered_draw(logits, mode, s, out=buffer, to_target=self.model.draft_to_target)[0]

    def _q(self, mode: str | None, k: int):
        """The q rows of the last sampled chain (None when greedy)."""
        if mode is None:
            return None
        return sampling.sampler(self.model.device).q(mode, self.model.vocab)[:k]

    def _absorb_fast(self, hidden: torch.Tensor, start: int, ids: torch.Tensor) -> None:
        """absorb's graph replay (start >= 1): the rows' tokens `ids` staged in next_ids, then `_absorb_rows`."""
        m = hidden.shape[0]
        self.next_ids[:m].copy_(ids, non_blocking=True)
        self.fast_absorb(hidden, start)

    def _absorb_chunks(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        """absorb on the absorb graph (a prompt, a chat turn's new rows): MAX_ROWS rows at a time, the last chunk
        padded, so every prompt meets the one shape captured at load. Eager, each prompt was a new attention shape,
        and SDPA built a cuDNN plan for it before the first token (H200: 50 ms to 1.4 s a shape). The padding's rows
        sit past the committed end, where the chain and later absorbs write before anything reads them."""
        end = start + hidden.shape[0]
        if start == 0:  # position 0 has no row before it: only its state is kept
            self.fused[:1] = self.model.fuse(hidden[:1])
            hidden, tokens, start = hidden[1:], tokens[1:], 1
        dev = self.model.device
        for at in range(0, hidden.shape[0], MAX_ROWS):
            part = hidden[at : at + MAX_ROWS]
            n = part.shape[0]
            if n < MAX_ROWS:
                part = torch.nn.functional.pad(part, (0, 0, 0, MAX_ROWS - n))
            self._absorb_fast(part, start + at, host_ids(tokens[at : at + n] + [0] * (MAX_ROWS - n), dev))
        self.commit(end)

    def _absorb_rows(self, hidden: torch.Tensor, positions: torch.Tensor, window: int) -> None:
        """absorb on device positions [start, start + m) (start >= 1): fused rows at the positions, drafter rows at
        start-1 ... start+m-2 fed the tokens staged in next_ids[:m]."""
        self.fused.index_copy_(0, positions, self.model.fuse(hidden))
        rows = positions - 1
        span = StaticSpan(self.cache, rows, window, self.cos, self.sin)
        self.model.rows(span, self.fused.index_select(0, rows), self.next_ids[: positions.shape[0]])

    def chain_step(self, pos: int, state: torch.Tensor, token) -> tuple[torch.Tensor, torch.Tensor]:
        """One chained row at `pos` fed `token` (an id, or a device tensor of one):
        returns (draft-vocab logits [Vd], output state [1, width])."""
        m = self.model
        if self.fast is not None:  # device positions over the whole cache: no attention shape per position
            where = upload([pos], m.device)
            span = StaticSpan(self.cache, where, self.cache.max_len, self.cos, self.sin)
        else:
            span = Span(self.cache, pos, 1, self.cos, self.sin)
        out = m.rows(span, state, upload(token, m.device))
        return m.logits(out)[0], out

    def first_state(self) -> tuple[int, torch.Tensor]:
        """Position and state of the first chained row: the latest committed target position."""
        pos = self.committed - 1
        return pos, self.fused[pos : pos + 1]

    def greedy_chain(self, last: int, k: int) -> torch.Tensor:
        """k greedy chained drafts (target ids, [k] on the device) after `last`; the tokens never leave the device
        (on the fast path: one graph replay)."""
        if self.fast is not None:  # the chain's rows sit at committed-1 ... committed+k-2
            return self.fast([last], self.committed, k,
                             positions=range(self.committed - 1, self.committed - 1 + k))
        pos, state = self.first_state()
        token, drafts = last, []
        for i in range(k):
            logits, state = self.chain_step(pos + i, state, token)
            token = self._to_target(logits.argmax(-1, keepdim=True))
            drafts.append(token)
        return torch.cat(drafts)

    def _chain(self, last: torch.Tensor, positions: torch.Tensor, window: int, k: int, mode=None) -> torch.Tensor:
        """The chain's graph: greedy (mode None) or sampled, each draft's q row written to the sampler's buffer as it
        is drawn."""
        return self._greedy_chain(last, positions, window, k) if mode is None else \
            self._sampled_chain(last, positions, window, k, mode)

    def _sampled_chain(self, last: torch.Tensor, positions: torch.Tensor, window: int, k: int,
                       mode: str) -> torch.Tensor:
        """_greedy_chain with each draft drawn from its filtered row: shape-static, no host sync."""
        m = self.model
        state = self.fused.index_select(0, positions[:1])
        token, drafts = last, []
        for i in range(k):
            span = StaticSpan(self.cache, positions[i : i + 1], window, self.cos, self.sin)
            state = m.rows(span, state, token)
            token = self._draw(m.logits(state), mode, i)
            drafts.append(token)
        return torch.cat(drafts)

    def _greedy_chain(self, last: torch.Tensor, positions: torch.Tensor, window: int, k: int) -> torch.Tensor:
        """The chain on device (positions [k]: its rows'): states and tokens never leave the GPU."""
        m = self.model
        state = self.fused.index_select(0, positions[:1])
        token, drafts = last, []
        for i in range(k):
            span = StaticSpan(self.cache, positions[i : i + 1], window, self.cos, self.sin)
            state = m.rows(span, state, token)
            token = self._to_target(ops.argmax_rows(m.logits(state)))
            drafts.append(token)
        return torch.cat(drafts)
