"""Distillation data: real code prompts continued by the target itself, in batches with a KV cache.

Most continuations are greedy (what speculative decoding at temperature 0 must predict); a fraction
is sampled at temperature 0.8 so the drafters also see the target's distribution."""

from __future__ import annotations

import torch

from ..models.qwen3 import Qwen3Model
from .spans import grouped_sdpa


class CachedBatch:
    """b sequences sharing positions [start, start + rows), keys kept in a batched cache."""

    def __init__(self, cache: list, start: int, rows: int, b: int, cos, sin):
        self.cache, self.start, self.rows, self.b = cache, start, rows, b
        self.cos, self.sin = cos[start : start + rows].repeat(b, 1), sin[start : start + rows].repeat(b, 1)

    def attend(self, layer: int, q, k, v, scale: float) -> torch.Tensor:
        ks, vs = self.cache[layer]
        end = self.start + self.rows
        ks[:, self.start : end] = k.reshape(self.b, self.rows, *k.shape[1:])
        vs[:, self.start : end] = v.reshape(self.b, self.rows, *v.shape[1:])
        causal = self.rows > 1  # a prompt from position 0; single rows see everything before them
        return grouped_sdpa(q, ks[:, :end], vs[:, :end], self.b, causal=causal, scale=scale)


@torch.no_grad()
def continue_prompts(model: Qwen3Model, prompts: torch.Tensor, length: int, sampled: torch.Tensor,
                     gen: torch.Generator) -> torch.Tensor:
    """prompts [b, p] -> [b, length]; rows where `sampled` is true draw at temperature 0.8."""
    cfg, dev = model.cfg, model.device
    b, p = prompts.shape
    shape = (b, length, cfg.num_key_value_heads, cfg.head_dim)
    # Under autocast keys come out in bf16: a cache in that precision avoids converting it every step.
    dtype = torch.get_autocast_dtype("cuda") if dev.type == "cuda" and torch.is_autocast_enabled("cuda") else model.dtype
    cache = [(torch.zeros(shape, device=dev, dtype=dtype), torch.zeros(shape, device=dev, dtype=dtype))
             for _ in range(cfg.num_hidden_layers)]
    seq = torch.empty(b, length, dtype=torch.long, device=dev)
    seq[:, :p] = prompts.to(dev)
    last_layer = (cfg.num_hidden_layers,)
    start, ids = 0, seq[:, :p]
    sampled = sampled.to(dev)
    for pos in range(p, length):
        span = CachedBatch(cache, start, ids.shape[1], b, model.cos, model.sin)
        h = model.run(ids.reshape(-1), span, last_layer, False).hidden.reshape(b, ids.shape[1], -1)[:, -1]
        logits = model.logits(h)
        probs = torch.softmax(logits / 0.8, dim=-1)
        draws = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(1).to(dev)
        seq[:, pos] = torch.where(sampled, draws, logits.argmax(-1))
        start, ids = pos, seq[:, pos : pos + 1]
    return seq.cpu()
