"""One conversation's state on the target: its static cache and how much of it is committed."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import torch

from ..errors import DflashError
from .. import tuning
from .graphs import MAX_ROWS, Fed, padded_prefill, prefill_rows, stage, upload, with_verdict


def now(device: torch.device) -> float:
    """Wall time after the device has finished queued work (a host sync: once per generation, not per step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def mark(device: torch.device):
    """A point in the device's queue, taken without waiting for it: a CUDA event, or on CPU (where
    work runs as it is queued) the wall time. `elapsed` reads two of them."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def elapsed(a, b) -> float:
    """Seconds from mark a to mark b; waits only if the device has not reached b yet (read marks after
    a sync that follows them, and this costs nothing)."""
    if isinstance(b, float):
        return b - a
    b.synchronize()
    return a.elapsed_time(b) / 1000


_side: dict = {}  # device -> the stream read_later's copies run on


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _side:
        _side[device] = torch.cuda.Stream(device)
    return _side[device]


def read_later(t: torch.Tensor, after=None):
    """Start bringing a device tensor's values to the host now; the returned callable waits for this copy only,
    not for work queued after it, and gives them as a list (on CPU they are read at once).
    after: a mark (`mark`) queued after the work that writes t, where nothing overwrites t before it is read: the
    copy then waits for that mark and reads t in place, and nothing more is queued on the step's stream."""
    if t.device.type != "cuda":
        values = t.tolist()
        return lambda: values
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    main = torch.cuda.current_stream(t.device)
    copied = torch.cuda.Event()
    # Off the step's stream: a side stream brings t back (a DMA copy in the step's stream leaves it idle before and
    # after), so the stream goes straight on to the next step. Without `after`, t may be a graph's output, which the
    # next replay overwrites: a kernel first copies it.
    side = _side_stream(t.device)
    if after is not None:
        side.wait_event(after)
        src = t
    else:
        src = torch.empty_like(t)
        stage(src, t)
        side.wait_stream(main)
    src.record_stream(side)  # its memory is not reused before the copy has read it
    with torch.cuda.stream(side):
        host.copy_(src, non_blocking=True)
        copied.record(side)

    def read() -> list:
        copied.synchronize()
        return host.tolist()

    return read


class Session:
    """Target model + static KV cache with a committed length.

    Invariant between generations: the cache holds every token of the
    conversation except `pending` (the last sampled tokens, not yet forwarded).
    """

    def __init__(self, model, max_len: int, path: str | None = None):
        """path: "graphs" (CUDA-graph replay of short forwards; the default on CUDA unless
        the `graphs` knob is off), "static" (the same device-position forward, run eagerly: tests
        it on CPU) or "eager" (the default on CPU)."""
        limit = model.cfg.max_position_embeddings
        if max_len > limit:
            raise DflashError(f"context {max_len} exceeds the model's {limit} positions")
        self.model = model
        self.cache = model.new_cache(max_len)
        # A hybrid target's recurrent state (layers/recurrent_state.py), None for an attention-only one: it cannot
        # roll back by a lower length alone, so it settles to the committed length before each forward.
        self.state = getattr(self.cache, "state", None)
        self.length = 0
        self.pending: list[int] = []
        if path is None:
            cuda = model.device.type == "cuda" and tuning.KNOBS.graphs
            path = "graphs" if cuda else "eager"
        self.path = path
        self.prepared = (0, 0.0)  # graphs captured at load and the seconds it took (runtime/warmup.py)
        self.fast = None
        if path in ("graphs", "static"):
            from .graphs import target_graphs

            self.fast = target_graphs(model, self.cache, use_graphs=path == "graphs")

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @property
    def device(self) -> torch.device:
        return self.model.device

    def room(self) -> int:
        """Positions still free for new tokens (pending ones included)."""
        return self.max_len - self.length - len(self.pending)

    def reset(self) -> None:
        self.length = 0
        self.pending = []
        if self.state is not None:
            self.state.clear()

    def can_roll_back(self, length: int) -> bool:
        """Whether the committed length may be lowered to `length`: always for a KV cache; a recurrent state only
        to 0 or into its last forward (runtime code that keeps an older prefix must start over instead)."""
        return self.state is None or self.state.reaches(length)

    def commit(self, length: int) -> None:
        """The committed length after a verify whose verdict kept its accepted rows inside the step (the KV past it
        is dropped by the length; a recurrent state was folded to it on the device: runtime/graphs.target_graphs)."""
        self.length = length
        if self.state is not None:
            self.state.at = length

    def fed_token(self, position: int) -> Fed | None:
        """The handle of the greedy token of the last one-row forward at `position`, where the graphs fed it on to the
        next step (graphs.Graphs.fed_token): forward it to continue that step."""
        return self.fast.fed_token(position) if self.fast is not None else None

    def forward(self, ids: Sequence[int] | torch.Tensor | Fed, capture=(), all_logits=False, accept=False):
        """Forward `ids` (host ids, a 1-D device tensor that stays on the device, or a fed token's handle) at the
        committed end and commit them. accept: with the greedy verdict on the rows (`out.verdict`; needs all_logits or one row),
        inside the step's graph on the graphs path. On the graphs path the output's tensors are the step's own buffers,
        which its next replay overwrites: clone what must outlive the next forward."""
        n = 1 if isinstance(ids, Fed) else len(ids)
        if self.length + n > self.max_len:
            raise DflashError(f"context is full ({self.max_len} tokens)")
        held = bool(accept) and n > 1  # a verify: its verdict commits a prefix of its rows (`commit`)
        # A hybrid's short forwards on the fast path are held: the graph folds the state to their last real row
        # (a verify's verdict, else state.last_row), so a short prompt pads like a Qwen3 one (one graph).
        folded = self.state is not None and self.fast is not None and 1 < n <= MAX_ROWS
        if self.state is not None:
            self.state.settle(self.length)
            self.state.began(self.length, n, held or folded)
            if folded and not held:
                self.state.last_row.fill_(n - 1)
        rows = None
        # Padding rows before a prompt would run through a recurrent state: a hybrid's long prompts run at their size.
        if self.fast is not None and n > 1 and not accept and not torch.is_tensor(ids) and \
                (self.state is None or n <= MAX_ROWS):
            rows = prefill_rows(n, self.length, self.max_len)  # a prompt: padded to a size bucket
        if rows is not None and n <= MAX_ROWS:
            # A short prompt: its rows first, then padding at the positions after it (consecutive, as every step's
            # rows are; later steps write those cache rows again before reading them), all rows' logits kept.
            out = self.fast(list(ids) + [0] * (rows - n), self.length, tuple(capture), True, False)
            out = dataclasses.replace(out, logits=out.logits[:n] if all_logits else out.logits[n - 1 : n],
                                      hidden=None if out.hidden is None else out.hidden[:n])
        elif self.fast is not None and n <= MAX_ROWS:
            out = self.fast(ids, self.length, tuple(capture), all_logits, accept)
        elif rows is not None:
            padded, positions = padded_prefill(ids, self.length, rows)
            out = self.fast(padded, self.length, tuple(capture), all_logits, False, positions=positions)
            pad = rows - n  # the padding rows come first: drop their states
            out = dataclasses.replace(out, logits=out.logits[pad:] if all_logits else out.logits,
                                      hidden=None if out.hidden is None else out.hidden[pad:])
        else:
            ids = upload(ids, self.device)
            hold = {"hold": True} if held and self.state is not None else {}
            out = with_verdict(self.model.forward(ids, self.length, self.cache, capture=capture,
                                                  all_logits=all_logits, **hold), ids, accept)
            if hold:
                self.model.commit_rows(self.cache, out.verdict[:1], n)
        self.length += n
        if folded and not held:
            self.commit(self.length)  # the graph folded the state to the prompt's last row
        return out
