"""CUDA-graph replay of the target's forwards: decode steps, verify spans, and prefills padded to a size bucket.

A graph is captured once per (rows, capture, all_logits) and replayed at any
position: the token ids and the rows' positions are copied into static device
buffers (one copy from pinned memory, no kernel), attention reads the whole cache
under a mask built from the positions on the device, and its kernels size their
work from the current length in device memory (kernels/attention.py), so one
graph serves the whole context and a generation never meets a new shape. On CPU
(or with `graphs=False`) the same static forward runs eagerly: that is how its
correctness is tested without a GPU.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch

from ..layers import ops
from ..layers.spans import MAX_STEP_ROWS
from . import sampling
from ..kernels import carveout

MAX_ROWS = MAX_STEP_ROWS  # the most rows of a step (decode, verify, draft); longer spans are prefills
# Prompts of up to this many rows are prefilled from graphs too, padded to a size bucket (`prefill_rows`): queueing
# a 2048-token prompt's eager forward took the host about as long as the device took to run it.
PREFILL_MAX_ROWS = 4096
PREFILL_STEP = 256
PREFILL_GRAPHS = 4


class Totals:
    """Process-wide counts over every Graphs object (target and drafters): bench reads the
    difference across its timed runs. `shapes` counts first uses of a key on any static path
    (on the graphs path each one is a capture; uncaptured prefills do not count), so CPU tests can check warm-up
    coverage."""

    shapes = 0
    captures = 0
    capture_s = 0.0

    @classmethod
    def snapshot(cls) -> tuple[int, int, float]:
        return cls.shapes, cls.captures, cls.capture_s


def host_ids(ids, device) -> torch.Tensor:
    """Host token ids (an int or a sequence) as a long CPU tensor, pinned when bound for a GPU:
    a copy from pageable memory may wait for the stream, one from pinned memory never does."""
    ids = [ids] if isinstance(ids, int) else list(ids)
    return torch.tensor(ids, dtype=torch.long, pin_memory=torch.device(device).type == "cuda")


def stage(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[:] = src (same shape) without a wait on the host; device to device as a kernel, since the stream idles
    around each small DMA copy between a step's graphs."""
    if dst.is_cuda and src.device == dst.device and src.dtype == dst.dtype:
        torch.mul(src, 1, out=dst)  # exact for every value (-0.0 stays -0.0)
    else:
        dst.copy_(src, non_blocking=True)


def stage_step(ids: torch.Tensor, src: torch.Tensor, positions: torch.Tensor, start: int, offset=None,
               fill: int = 0) -> None:
    """ids[:len(src)] = src, the rest of ids = fill, and positions[:] = start (+ offset, a long device scalar such as
    a verdict's count), start + 1, ...: one kernel where the Triton kernels run. Each small kernel between two graphs
    costs the stream a few µs, and a DFlash block ([bonus, masks...] after the accepted drafts) would take six."""
    offset = offset.reshape(1) if offset is not None else None
    fits = (ids.is_cuda and src.device == ids.device == positions.device and src.dim() == 1
            and src.dtype == ids.dtype == positions.dtype == torch.long and ids.is_contiguous()
            and positions.is_contiguous()
            and (offset is None or (offset.device == ids.device and offset.dtype == torch.long)))
    if fits and ops.stage_step(ids, src, positions, start, offset, fill):
        return
    s = src.shape[0]
    stage(ids[:s], src)
    if s < ids.shape[0]:
        ids[s:].fill_(fill)
    stage_positions(positions, start)
    if offset is not None:
        positions.add_(offset)


_rows: dict = {}  # device -> arange(MAX_ROWS) there


def stage_positions(dst: torch.Tensor, start: int) -> None:
    """dst[:] = start, start + 1, ...: one kernel, the start a launch argument (nothing to copy from the host)."""
    rows = _rows.get(dst.device)
    if rows is None:
        rows = _rows[dst.device] = torch.arange(MAX_ROWS, dtype=dst.dtype, device=dst.device)
    torch.add(rows[: dst.shape[0]], start, out=dst)


def upload(ids, device) -> torch.Tensor:
    """Token ids (an int, a sequence or a tensor) as a 1-D long tensor on `device`, without a host sync."""
    src = ids.reshape(-1) if torch.is_tensor(ids) else host_ids(ids, device)
    return src.to(device, torch.long, non_blocking=True)


def prefill_rows(n: int, start: int, max_len: int) -> int | None:
    """The padded size of an n-row prefill at `start`: MAX_ROWS rows for a short prompt (one graph for every chat
    turn of up to MAX_ROWS tokens: Session.forward), 64, 128 or 256 rows, then multiples of PREFILL_STEP; None where
    it runs without padding (too long, or its padding would pass the cache's end)."""
    if n <= MAX_ROWS:
        return MAX_ROWS if start + MAX_ROWS <= max_len else None
    rows = 64
    while rows < n and rows < PREFILL_STEP:
        rows *= 2
    if rows < n:
        rows = -(-n // PREFILL_STEP) * PREFILL_STEP
    return rows if rows <= PREFILL_MAX_ROWS and start + rows <= max_len else None


def padded_prefill(ids, start: int, rows: int) -> tuple[list[int], list[int]]:
    """(ids, positions) of a prefill padded to `rows`: the padding rows first, at the positions after the prompt
    (no prompt row sees their keys, and later steps write those cache rows again before reading them), so the
    prompt's last row stays the last row, the one a forward takes logits from."""
    n = len(ids)
    return [0] * (rows - n) + list(ids), list(range(start + n, start + rows)) + list(range(start, start + n))


@dataclass(frozen=True, eq=False)  # a handle: equal only to itself
class Fed:
    """The token a feeding step (a greedy decode step) wrote into its own next inputs, for the row at `position`:
    passed back as the next step's ids, that step continues the feeding one and stages nothing. `token` is a 0-d
    device view, unchanged until `position` is forwarded again."""

    token: torch.Tensor
    position: int


@dataclass
class _Captured:
    ids: torch.Tensor
    positions: torch.Tensor
    out: object
    graph: object | None
    inputs: torch.Tensor | None  # [ids | positions] when both come from the host: one copy fills both


class Graphs:
    """Captured replays of `fn(ids, positions, window, *extra)`, one per key (rows, *extra): ids and positions
    (device int64 [P]) are static device buffers; window is max_len, the whole cache (the attention kernels read
    only up to the current length), so a step's graph serves every position.

    Steps whose key `feeds` (a greedy decode step) stage their own next inputs: fn writes the step's token into its
    ids, the next position into its positions and the token into `fed` at that position (ops.greedy_verdict's feed).
    A call given that token's handle (`fed_token`, a Fed) continues the last such replay and stages nothing."""

    def __init__(self, fn, device, max_len: int, use_graphs: bool = True, feeds=None, fed=None):
        self.fn, self.device, self.max_len = fn, torch.device(device), max_len
        self.feeds, self.fed = feeds, fed  # feeds(key) -> bool (None: no key does); fed: long [max_len + 1]
        self._fed: tuple | None = None  # (key, Fed): the last feeding step's and the token its buffers hold
        self.requested = use_graphs  # the session path's choice, whatever the device (see drafters' reset)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.steps: dict[tuple, _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.capture_s = 0.0  # total time spent capturing (reported by bench)
        self.captures = 0
        # Prefills of more than MAX_ROWS rows run eagerly: a capture costs about two forwards and a prompt's size
        # rarely comes back in a chat, while a graph saves a 2048-token prompt 6 ms (docs/TUNING.md). The bench,
        # which runs each prompt again and again, captures them (capture_prefills).
        self.capture_prefills = False
        self.prefill_graphs = PREFILL_GRAPHS  # how many prefill graphs are kept
        # Run after a capture's warm-up run: undo what it did that its replay does again and must not find done
        # (a recurrent state; KV rows are simply written again).
        self.after_warmup = None

    def __call__(self, ids, start: int, *extra, positions=None):
        """Run on `ids` (host token ids, or a tensor of rows: device tensors are copied on the device) at
        positions [start, start + len(ids)) or the given `positions` (host ints, as many per key, or a device
        tensor: then ids must be one too). ids may be the Fed handle of the last feeding step's token."""
        fed = ids if isinstance(ids, Fed) else None
        if fed is not None:
            ids = fed.token.view(1)
        n = len(ids)
        key = (n, *extra)
        step = self.steps.get(key)
        on_host = not torch.is_tensor(ids)
        # Device ids at consecutive positions on a built step (a decode step after its predecessor, a verify
        # span): a kernel writes the positions, nothing comes from the host (src None).
        src = None
        if torch.is_tensor(positions):  # on the device, as ids then are: nothing to stage from the host
            src = positions
        elif on_host or step is None:
            pos = list(range(start, start + n)) if positions is None else list(positions)
            # Ids and positions in one pinned host tensor, so one copy stages a replay's inputs.
            src = host_ids((list(ids) if on_host else []) + pos, self.device)
        if n > MAX_ROWS:  # a prefill: uncaptured unless capture_prefills, and at most prefill_graphs kept
            if step is not None:
                self.steps[key] = self.steps.pop(key)  # most recently used last; its inputs are staged below
            elif not self.capture_prefills:
                inputs = src.to(self.device, non_blocking=True)
                ids = inputs[:n] if on_host else ids
                return self.fn(ids, inputs[n:] if on_host else inputs, self.max_len, *extra)
            else:
                self._evict_prefills()
        built = step is None
        if built:
            step = self.steps[key] = self._build(key, ids, src, on_host)
        elif positions is None and self._continues(key, start, fed):
            pass  # its last replay staged this one's inputs (the token it fed, the next position)
        elif on_host and step.inputs is not None:
            step.inputs.copy_(src, non_blocking=True)
        elif src is None:  # device ids at consecutive positions
            stage_step(step.ids, ids, step.positions, start)
        else:
            stage(step.ids, src[:n] if on_host else ids)
            stage(step.positions, src[n:] if on_host else src)
        return self._replay(step, key, built, start + 1 if positions is None else None)

    def staged(self, n: int, stage_inputs, *extra):
        """Run the step of `n` rows (at most MAX_ROWS) whose inputs `stage_inputs(ids, positions)` writes on the
        device straight into the step's own buffers: nothing else is queued before the replay."""
        key = (n, *extra)
        step = self.steps.get(key)
        if step is None:  # its first use: staged into fresh buffers, from which it is built
            ids = torch.empty(n, dtype=torch.long, device=self.device)
            positions = torch.empty_like(ids)
            stage_inputs(ids, positions)
            return self(ids, 0, *extra, positions=positions)
        stage_inputs(step.ids, step.positions)
        return self._replay(step, key, False, None)

    def _feeds(self, key) -> bool:
        return self.feeds is not None and self.feeds(key)

    def _replay(self, step: _Captured, key, built: bool, next_position: int | None):
        """Replay (or run) the step; for a feeding one, remember where its buffers now stand (next_position: the
        position after its row, None where the host does not know it)."""
        if self._feeds(key):
            self._fed = (key, Fed(self.fed[next_position], next_position)) if next_position is not None else None
        if step.graph is not None:
            step.graph.replay()
        else:
            step.out = self._run(step, key)
            if built and self.device.type == "cuda":
                carveout.apply()  # the kernels this uncaptured step compiled (captured steps: _build)
        return step.out

    def _continues(self, key, start: int, fed: Fed | None) -> bool:
        """Whether this call is the last feeding replay's next step: its key, at the position after, on the handle
        of the token it fed."""
        return fed is not None and self._fed is not None and self._fed[0] == key and self._fed[1] is fed \
            and fed.position == start

    def fed_token(self, position: int) -> Fed | None:
        """The handle of the token the last feeding step fed on from `position`, or None where the last feeding
        step was elsewhere."""
        if self._fed is None or self._fed[1].position != position + 1:
            return None
        return self._fed[1]

    def _evict_prefills(self) -> None:
        """Make room for one more prefill graph: drop the least recently used beyond prefill_graphs - 1."""
        prefills = [key for key in self.steps if key[0] > MAX_ROWS]
        for key in prefills[: max(0, len(prefills) - self.prefill_graphs + 1)]:
            del self.steps[key]

    def _run(self, step: _Captured, key):
        return self.fn(step.ids, step.positions, self.max_len, *key[1:])

    def _build(self, key, ids, src: torch.Tensor, on_host: bool) -> _Captured:
        dev = self.device
        inputs = src.to(dev, copy=True, non_blocking=True)
        if on_host:
            step = _Captured(ids=inputs[: key[0]], positions=inputs[key[0]:], out=None, graph=None, inputs=inputs)
        else:
            step = _Captured(ids=ids.to(dev, copy=True), positions=inputs, out=None, graph=None, inputs=None)
        Totals.shapes += 1
        if not self.use_graphs:
            return step
        t0 = time.perf_counter()
        # Warm up on a side stream (lazy inits must not be captured), then capture. Both compute
        # with the real inputs, so the KV rows they write are the ones the replay writes again.
        feeds = self._feeds(key)
        staged = (step.ids.clone(), step.positions.clone()) if feeds else None  # its run moves them on
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            self._run(step, key)
        torch.cuda.current_stream(dev).wait_stream(side)
        if feeds:
            step.ids.copy_(staged[0])
            step.positions.copy_(staged[1])
        if self.after_warmup is not None:
            self.after_warmup()
        carveout.apply()  # one L1 / shared split for every kernel of the step, before the capture
        # Graphs of dropped sessions sit in reference cycles; if the cyclic GC freed one during a capture, its
        # teardown would invalidate the capture: no collection during it (warmup.capture_all collects before).
        # Captured on the side stream by hand: torch.cuda.graph would also synchronise and empty the allocator's
        # cache at every capture, and the load captures several in a row.
        graph = torch.cuda.CUDAGraph()
        gc.disable()
        try:
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                graph.capture_begin(pool=self.pool)
                try:
                    step.out = self._run(step, key)
                finally:
                    graph.capture_end()
            torch.cuda.current_stream(dev).wait_stream(side)
        finally:
            gc.enable()
        step.graph = graph
        torch.cuda.synchronize(dev)
        took = time.perf_counter() - t0
        self.capture_s += took
        self.captures += 1
        Totals.capture_s += took
        Totals.captures += 1
        return step


def with_verdict(out, ids: torch.Tensor, accept, feed=None):
    """The forward's output with the verdict on its rows where asked: accept True, the greedy one
    (ops.greedy_verdict); a sampled mode (sampling.mode), block verification of the drafts against the q rows the
    drafter left in the sampler's buffer (sampling.verdict). feed: ops.greedy_verdict's."""
    if accept is True:
        out.verdict = ops.greedy_verdict(ids, out.logits, feed)
    elif accept:
        out.verdict = sampling.verdict(ids, out.logits, accept, feed)
    return out


def target_graphs(model, cache, use_graphs: bool = True) -> Graphs:
    """Decode steps and verify spans of the target: extra key = (capture, all_logits, accept); with accept the
    verdict on the rows (greedy: ops.greedy_verdict; sampled: sampling.verdict, its params read from device
    tensors) is part of the graph, and a one-row step feeds its token to its next replay (Graphs.fed_token): a plain
    step then stages nothing (on the H100 the staging kernel and the token's copy for the host cost a decode step
    about 6 us)."""

    fed = torch.zeros(cache.max_len + 1, dtype=torch.long, device=model.device)

    def feeds(key) -> bool:
        return key[0] == 1 and bool(key[-1])

    # A hybrid target (a recurrent state beside the KV): a verify leaves the state where it started and, once the
    # verdict is in, folds in its accepted rows (n read from device memory), inside the step; a short prompt, padded to
    # one graph's rows like a Qwen3 one, folds in its real rows.
    recurrent = getattr(model, "recurrent", False)

    def fn(ids, positions, window, capture, all_logits, accept=False):
        feed = (positions, fed) if accept and len(ids) == 1 else None
        # Held: a verify (it keeps its accepted rows) and a prompt (its real rows, before the padding: state.last_row).
        hold = recurrent and 1 < len(ids) <= cache.state.max_rows
        out = model.forward_static(ids, positions, cache, window, capture, all_logits,
                                   **({"hold": True} if hold else {}))
        out = with_verdict(out, ids, accept, feed)
        if hold:
            model.commit_rows(cache, out.verdict[:1] if accept else cache.state.last_row, len(ids))
        return out

    graphs = Graphs(fn, model.device, cache.max_len, use_graphs, feeds, fed)
    if recurrent:
        graphs.after_warmup = cache.state.restart  # a capture's warm-up run moved the state: the replay moves it again
    return graphs
