"""Where a forward's rows sit in a KV cache and which keys they see.

`Span` is the eager form: positions are a host integer, writes and reads are
slices. `StaticSpan` holds positions in device memory and reads a fixed window
of the cache under a mask, so a forward built on it can be captured once in a
CUDA graph and replayed at any position.

Both take `layer_masks` where a model's layers see different keys (a DFlash
drafter's sliding-window layers): per layer an object with `causal` and
`window` (models/dflash.LayerAttention); without it every layer follows `causal`.
"""

from __future__ import annotations

import functools

import torch

from . import ops
from .kv_cache import KVCache

# The most rows of one step's forward (decode, verify, draft block; longer spans are prefills): the graphs' row keys,
# a drafter's q buffer and a recurrent state's kept rows are sized by it (a DFlash-b16 verify: 16).
MAX_STEP_ROWS = 32


class Span:
    def __init__(self, cache: KVCache, start: int, rows: int, cos: torch.Tensor, sin: torch.Tensor, causal=True,
                 layer_masks=None):
        self.cache, self.start, self.causal, self.layer_masks = cache, start, causal, layer_masks
        self.cos, self.sin = cos[start : start + rows], sin[start : start + rows]

    def write(self, layer: int, k, v) -> None:
        self.cache.write(layer, self.start, k, v)

    def write_layers(self, k, v, k_norms, eps: float) -> None:
        """As StaticSpan.write_layers."""
        for i in range(k.shape[1]):
            self.write(i, ops.apply_rope(ops.rms_norm(k[:, i], k_norms[i], eps), self.cos, self.sin), v[:, i])

    def attend(self, layer: int, q, k, v, scale: float) -> torch.Tensor:
        keys, values = self.cache.write(layer, self.start, k, v)
        if self.layer_masks is None:
            return ops.attention(q, keys, values, q_offset=self.start, causal=self.causal, scale=scale)
        m = self.layer_masks[layer]
        return ops.attention(q, keys, values, q_offset=self.start, causal=m.causal, scale=scale, window=m.window)


class StaticSpan:
    def __init__(self, cache: KVCache, positions: torch.Tensor, window: int, cos: torch.Tensor,
                 sin: torch.Tensor, causal=True, layer_masks=None):
        """positions: the rows' cache positions, device int64 [T]: consecutive, except in a padded prefill
        (padding rows first, at positions after the prompt's), whose rows are too many for the fresh kernel, the
        one that assumes consecutive positions; window: how many cache rows attention reads (> the last position)."""
        self.cache, self.window = cache, window
        self.positions = positions
        self.tables = cos, sin  # whole: the fused kernel reads them at the positions
        # The last key each row sees: itself (causal) or the span's last row (a non-causal block; a broadcast
        # view, no kernel).
        self.limit = self._bounds(causal, None)[0]
        # Per layer (layer_masks): (limit, the first key each row sees or None), made here, before any layer runs.
        self.bounds = None
        if layer_masks is not None:
            made = {}
            for m in layer_masks:
                if (m.causal, m.window) not in made:
                    made[m.causal, m.window] = self._bounds(m.causal, m.window)
            self.bounds = [made[m.causal, m.window] for m in layer_masks]

    def _bounds(self, causal: bool, window: int | None):
        p = self.positions
        limit = p if causal else p[-1:].expand(p.shape[0])
        if window is None:
            return limit, None
        if not causal:  # a non-causal window reaches as far after the row as before it
            limit = torch.minimum(limit, p + (window - 1))
        return limit, p - (window - 1)

    def _layer_bounds(self, layer: int):
        return (self.limit, None) if self.bounds is None else self.bounds[layer]

    @functools.cached_property
    def cos(self) -> torch.Tensor:  # the rows' own [T, D], gathered only where a caller rotates by itself
        return self.tables[0].index_select(0, self.positions)

    @functools.cached_property
    def sin(self) -> torch.Tensor:
        return self.tables[1].index_select(0, self.positions)

    def write(self, layer: int, k, v) -> None:
        self.cache.k[layer].index_copy_(0, self.positions, k)
        self.cache.v[layer].index_copy_(0, self.positions, v)

    def attend(self, layer: int, q, k, v, scale: float) -> torch.Tensor:
        self.write(layer, k, v)
        return self._attend_cache(layer, q, scale)

    def write_layers(self, k, v, k_norms, eps: float) -> None:
        """Every layer's keys straight from the projection (normed here, then rotated) and values:
        k, v [T, layers, KV, D], k_norms [layers, D]. One kernel on the GPU."""
        ops.k_norm_rope_write_layers(k, v, k_norms, eps, *self.tables, self.cache.k, self.cache.v, self.positions)

    def attend_fresh(self, layer: int, q, k, v, q_norm, k_norm, eps: float, scale: float,
                     then=None, gate=None) -> torch.Tensor:
        """q/k straight from the projection: normalise, rotate, write k/v and attend (on the GPU the
        attention kernel does the norm, RoPE and cache write as well). then: the weight read after the attention, for
        the GPU to warm; gate: an output gate (ops.attend_fresh)."""
        limit, low = self._layer_bounds(layer)
        return ops.attend_fresh(q, k, v, q_norm, k_norm, eps, *self.tables, self.cache.k[layer],
                                self.cache.v[layer], self.positions, self.window, limit, scale, then, low, gate=gate)

    def _attend_cache(self, layer: int, q, scale: float) -> torch.Tensor:
        w = self.window
        limit, low = self._layer_bounds(layer)
        return ops.attention_window(q, self.cache.k[layer, :w], self.cache.v[layer, :w], limit, scale, low)
