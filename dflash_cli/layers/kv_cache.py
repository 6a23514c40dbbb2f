"""Static, preallocated KV cache for one sequence (batch size 1).

The committed length lives with the caller: rolling back rejected positions is
setting a smaller length, never a copy, because later writes overwrite them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    k: torch.Tensor  # [layers, max_len, kv_heads, head_dim]
    v: torch.Tensor

    @classmethod
    def allocate(cls, layers: int, max_len: int, kv_heads: int, head_dim: int, dtype, device) -> "KVCache":
        shape = (layers, max_len, kv_heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v rows at [start, start+T) and return the layer's keys/values [0, start+T)."""
        end = start + k.shape[0]
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v
        return self.k[layer, :end], self.v[layer, :end]
