"""Training spans: the `Span` interface (cos/sin of the rows, write, attend) over a batch of
sequences flattened to rows, with the attention pattern each objective needs. The model code
is the inference code; only where keys live and which ones a row sees differs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_sdpa(q, keys, values, b: int, mask=None, causal=False, scale=None) -> torch.Tensor:
    """q [b*T, H, D], keys/values [b, S, KV, D] -> [b*T, H*D], grouped heads expanded."""
    h, d = q.shape[1], q.shape[2]
    q = q.reshape(b, -1, h, d).transpose(1, 2)
    group = h // keys.shape[2]
    # Cached keys may be stored in another precision than autocast gives q.
    k = keys.to(q.dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    v = values.to(q.dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    return out.transpose(1, 2).reshape(-1, h * d)


class CausalBatch:
    """b sequences of t rows at positions 0..t-1: the target's training forward."""

    def __init__(self, b: int, t: int, cos: torch.Tensor, sin: torch.Tensor):
        self.b, self.t = b, t
        self.cos, self.sin = cos[:t].repeat(b, 1), sin[:t].repeat(b, 1)

    def attend(self, layer: int, q, k, v, scale: float) -> torch.Tensor:
        shape = (self.b, self.t) + k.shape[1:]
        return grouped_sdpa(q, k.reshape(shape), v.reshape(shape), self.b, causal=True, scale=scale)


class _Rows:
    def __init__(self, cos, sin, owner):
        self.cos, self.sin, self.owner = cos, sin, owner

    def write(self, layer: int, k, v) -> None:
        self.owner.context[layer] = (k, v)

    def attend(self, layer: int, q, k, v, scale: float) -> torch.Tensor:
        return self.owner.attend_block(layer, q, k, v, scale)


class DFlashBlocks:
    """Many DFlash blocks per sequence at once. Sequence i has t context rows (target states at
    positions 0..t-1) and n blocks; block j sits at positions anchors[i, j] .. + size - 1 and sees
    context rows before its anchor plus its own rows (non-causal), exactly as at inference."""

    def __init__(self, anchors: torch.Tensor, t: int, size: int, cos: torch.Tensor, sin: torch.Tensor):
        b, n = anchors.shape
        dev = anchors.device
        self.b, self.t, self.rows = b, t, n * size
        self.context: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        pos = (anchors[:, :, None] + torch.arange(size, device=dev)).reshape(b, -1)  # [b, n*size]
        self.ctx = _Rows(cos[:t].repeat(b, 1), sin[:t].repeat(b, 1), self)
        self.block = _Rows(cos[pos.reshape(-1)], sin[pos.reshape(-1)], self)
        anchor_of_row = anchors.repeat_interleave(size, dim=1)  # [b, n*size]
        sees_ctx = torch.arange(t, device=dev)[None, None, :] < anchor_of_row[:, :, None]
        block_id = torch.arange(n, device=dev).repeat_interleave(size)
        sees_block = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
        self.mask = torch.cat([sees_ctx, sees_block], dim=2)[:, None]  # [b, 1, rows, t + rows]

    def attend_block(self, layer: int, q, k, v, scale: float) -> torch.Tensor:
        ck, cv = self.context[layer]
        b = self.b
        keys = torch.cat([ck.reshape(b, self.t, *ck.shape[1:]), k.reshape(b, self.rows, *k.shape[1:])], dim=1)
        values = torch.cat([cv.reshape(b, self.t, *cv.shape[1:]), v.reshape(b, self.rows, *v.shape[1:])], dim=1)
        return grouped_sdpa(q, keys, values, b, mask=self.mask, scale=scale)


class Eagle3Steps:
    """Training-time test for the EAGLE-3 layer: step j's row at position p stands for the j-th
    chained draft of a chain that started at p - j. It sees step-0 rows (real target states) up to
    p - j and, for s = 1..j, step s's row at p - j + s: the chain's own earlier rows, as the
    drafter's KV cache holds them at inference."""

    def __init__(self, b: int, t: int, cos: torch.Tensor, sin: torch.Tensor):
        self.b, self.t = b, t
        self.cos, self.sin = cos[:t].repeat(b, 1), sin[:t].repeat(b, 1)
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attend(self, layer: int, q, k, v, scale: float) -> torch.Tensor:
        b, t = self.b, self.t
        self.steps.append((k.reshape(b, t, *k.shape[1:]), v.reshape(b, t, *v.shape[1:])))
        j = len(self.steps) - 1
        dev = q.device
        p = torch.arange(t, device=dev)[:, None]
        kp = torch.arange(t, device=dev)[None, :]
        mask = [kp <= p - j] + [kp == p - j + s for s in range(1, j + 1)]
        keys = torch.cat([s[0] for s in self.steps], dim=1)
        values = torch.cat([s[1] for s in self.steps], dim=1)
        return grouped_sdpa(q, keys, values, b, mask=torch.cat(mask, dim=1), scale=scale)
