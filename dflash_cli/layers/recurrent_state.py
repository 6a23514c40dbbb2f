"""The recurrent state of a hybrid target's Gated DeltaNet layers, beside the attention layers' KV cache.

Per linear-attention layer: the conv window (the last K - 1 pre-conv rows) and the memory S [H_v, d_k, d_v] in
float32. A KV cache rolls back by lowering the committed length; a recurrent state cannot, so every forward keeps
what a rewind needs: the state it started from (S0, conv0) and, for a forward of at most MAX_ROWS rows, each row's
normalised key k_t, correction δ_t, log-decay g_t and pre-conv input. The state after any row n of that forward is
then the closed-form fold (the recurrence S_t = e^{g_t} S_{t-1} + k_t δ_tᵀ unrolled from S0):

    S_n = e^{G_n} S0 + Σ_{t<=n} e^{G_n - G_t} k_t δ_tᵀ,   G_t = g_0 + ... + g_t,

and the conv window after row n is rows n+1 .. n+K-1 of [conv0 ; the forward's inputs]. `fold` takes n as a device
tensor (a verify's accepted count, inside its graph) or a host int (a rollback).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ops
from .kv_cache import KVCache


class RecurrentState:
    """Conv windows and memories of a model's L Gated DeltaNet layers (stacked), with the last forward's rows.

    Host bookkeeping (`start`, `rows`, `at`) says which positions the state holds: `at` is the committed length it
    has absorbed (None: whatever a device verdict committed, until `Session.commit` names it)."""

    def __init__(self, layers: int, conv_dim: int, kernel: int, k_heads: int, v_heads: int, dk: int, dv: int,
                 max_rows: int, dtype, device):
        f32 = dict(dtype=torch.float32, device=device)
        self.kernel, self.max_rows, self.group = kernel, max_rows, v_heads // k_heads
        self.conv = torch.zeros(layers, kernel - 1, conv_dim, dtype=dtype, device=device)
        self.S = torch.zeros(layers, v_heads, dk, dv, **f32)
        self.conv0, self.S0 = torch.zeros_like(self.conv), torch.zeros_like(self.S)
        self.x = torch.zeros(layers, max_rows, conv_dim, dtype=dtype, device=device)  # pre-conv inputs
        self.k = torch.zeros(layers, max_rows, k_heads, dk, **f32)  # l2-normalised keys
        self.delta = torch.zeros(layers, max_rows, v_heads, dv, **f32)
        self.g = torch.zeros(layers, max_rows, v_heads, **f32)
        # The committed length S0 / conv0 hold: the start of the forward that kept them (-1: none yet).
        self.s0_at = torch.full((1,), -1, dtype=torch.long, device=device)
        # The last real row of a held prompt forward (padded to a graph's rows): its fold's n, written before it runs.
        self.last_row = torch.zeros(1, dtype=torch.long, device=device)
        self.start, self.rows, self.at = 0, 0, 0

    # Device side: what a forward runs (capturable: fixed shapes, n may live in device memory). A forward of at most
    # max_rows rows writes its rows into x, k, delta and g itself (layers/delta_rule.short_conv and rows, `keep`).

    def begin(self, start) -> None:
        """A forward at `start` (an int, or its first row's position on the device) starts from the current state:
        keep it for a rewind."""
        self.S0.copy_(self.S)
        self.conv0.copy_(self.conv)
        if torch.is_tensor(start):
            self.s0_at.copy_(start.reshape(1))
        else:
            self.s0_at.fill_(start)

    def fold(self, n, rows: int) -> None:
        """Set the state to the one after row n (long [1] on the device, or an int >= 0) of the last forward of
        `rows` rows, from S0, conv0 and the rows kept. Rows after n weigh zero (the grid stays static). Two Triton
        launches on CUDA (kernels/delta_rule.fold: the same update, applied row by row); this torch form is their
        reference."""
        n = n.reshape(1) if torch.is_tensor(n) else torch.tensor([n], device=self.S.device)
        if kernel := ops.model_kernels(self.S, "delta_rule"):
            kernel.fold(self.S0, self.S, self.k, self.delta, self.g, self.conv0, self.conv, self.x, n, rows)
            return
        g = self.g[:, :rows]
        G = g.cumsum(1)  # [L, T, H_v]
        Gn = G.index_select(1, n)  # [L, 1, H_v]
        keep = torch.arange(rows, device=g.device) <= n  # [T]
        w = torch.where(keep[None, :, None], Gn - G, torch.full_like(G, float("-inf"))).exp()
        k = self.k[:, :rows].repeat_interleave(self.group, dim=2)  # [L, T, H_v, d_k]
        writes = torch.einsum("lthk,lthv->lhkv", k * w[..., None], self.delta[:, :rows])
        self.S.copy_(Gn.exp()[:, 0, :, None, None] * self.S0 + writes)
        window = torch.cat([self.conv0, self.x[:, :rows]], dim=1)  # [L, K - 1 + T, C]
        idx = n + 1 + torch.arange(self.kernel - 1, device=n.device)
        self.conv.copy_(window.index_select(1, idx))

    def restart(self) -> None:
        """Back to the state the last forward (queued at `start`) started from. A forward interrupted before it kept
        that state (Ctrl-C between its bookkeeping and its `begin`) never moved it: S0 then holds an older start, and
        the state stays (a device-side choice: no host sync)."""
        began = self.s0_at == self.start
        self.S.copy_(torch.where(began, self.S0, self.S))
        self.conv.copy_(torch.where(began, self.conv0, self.conv))

    def clear(self) -> None:
        self.S.zero_()
        self.conv.zero_()
        self.s0_at.fill_(-1)
        self.start, self.rows, self.at = 0, 0, 0

    # Host side: which committed length the state holds, and the rewinds a lowered length needs.

    def began(self, start: int, rows: int, held: bool) -> None:
        """A forward of `rows` rows at `start` was queued; held: its verdict commits a prefix in the step (`fold`)."""
        self.start, self.rows = start, rows
        self.at = None if held else start + rows

    def reaches(self, length: int) -> bool:
        """Whether `settle` can bring the state to `length` (from 0, or within the last forward)."""
        if length in (0, self.at):
            return True
        m = length - self.start - 1
        return m == -1 or 0 <= m < self.rows <= self.max_rows

    def settle(self, length: int) -> None:
        """Make the state hold exactly the first `length` positions before the next forward: a committed length
        lowered since the last forward (rejected rows, a cut at a stop id, a dropped look-ahead, an interrupt)
        rewinds within that forward."""
        if self.at == length:
            return
        if length == 0:
            self.clear()
            return
        m = length - self.start - 1  # the last kept row of the last forward
        if not self.reaches(length):
            raise RuntimeError(f"recurrent state holds positions [0, {self.start + self.rows}) and cannot rewind to "
                               f"{length}: only within its last forward [{self.start}, {self.start + self.rows})")
        if m == -1:
            self.restart()
        else:
            self.fold(m, self.rows)
        self.at = length


@dataclass
class HybridCache:
    """A hybrid target's per-sequence memory: KV of its full-attention layers (indexed by their order among them)
    and the recurrent state of its Gated DeltaNet layers."""

    kv: KVCache
    state: RecurrentState

    @property
    def max_len(self) -> int:
        return self.kv.max_len
