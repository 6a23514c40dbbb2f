"""Distillation data: prompts continued by the target itself, in batches with a KV cache.

Each part of the data draws one prompt length and one continuation length (varied lengths across
parts). A row's prompt is a window of the training files at a random offset or one the target writes
itself at temperature 1 from a file start (prompts beyond the files); its continuation is greedy (what
speculative decoding at temperature 0 must predict) or sampled at one of the preset's temperatures,
so the drafters also see the target's distribution. Parts are files of their own: a cut-short run
resumes at the first missing part, and a part's draws come from generators seeded by its index."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..models.qwen3 import Qwen3Model
from ..runtime.sampling import race
from .loop import batch_generator
from .presets import Preset
from .spans import grouped_sdpa
from .target import windows


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
def continue_prompts(model: Qwen3Model, prompts: torch.Tensor, length: int, temperature: torch.Tensor,
                     gen: torch.Generator) -> torch.Tensor:
    """prompts [b, p] -> [b, length]; row i draws at temperature[i] (0: greedy). Draws are runtime/sampling's
    exponential race with noise from `gen`, a generator on the model's device."""
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
    temperature = temperature.to(dev, torch.float32)
    sampled, scale = (temperature > 0)[:, None], temperature.clamp_min(1e-6)[:, None]
    for pos in range(p, length):
        span = CachedBatch(cache, start, ids.shape[1], b, model.cos, model.sin)
        h = model.run(ids.reshape(-1), span, last_layer, False).hidden.reshape(b, ids.shape[1], -1)[:, -1]
        logits = model.logits(h).float()
        draws = race(torch.softmax(logits / scale, dim=-1), gen)
        seq[:, pos] = torch.where(sampled[:, 0], draws, logits.argmax(-1))
        start, ids = pos, seq[:, pos : pos + 1]
    return seq.cpu()


@dataclass
class Distilled:
    """Rows of the target's continuations padded to one width; row i's prompt is tokens[i, :first[i]] and the
    target wrote tokens[i, first[i]:length[i]]."""

    tokens: torch.Tensor  # [N, W]
    first: torch.Tensor  # [N]
    length: torch.Tensor  # [N]

    def produced(self) -> torch.Tensor:
        """[N, W] bool: the positions the target wrote."""
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return (pos >= self.first[:, None]) & (pos < self.length[:, None])

    def to(self, device) -> "Distilled":
        return Distilled(self.tokens.to(device), self.first.to(device), self.length.to(device))

    def rows(self, idx: torch.Tensor) -> "Distilled":
        return Distilled(self.tokens[idx].long(), self.first[idx], self.length[idx])


def parts(p: Preset) -> int:
    return -(-p.distill_sequences // p.distill_batch)


def make_part(target: Qwen3Model, train_ids: torch.Tensor, p: Preset, seed: int, i: int, eos: int) -> dict:
    """Part i of the distillation data: {"tokens": [n, prompt + continuation] int16/32, "first": prompt length,
    "synth", "temperature": per row}."""
    g = batch_generator(seed, "distill", i)
    n = min(p.distill_batch, p.distill_sequences - i * p.distill_batch)
    first = p.distill_prompts[int(torch.randint(len(p.distill_prompts), (1,), generator=g))]
    cont = p.distill_continuations[int(torch.randint(len(p.distill_continuations), (1,), generator=g))]
    prompts = windows(train_ids, n, first, g)
    synth = torch.rand(n, generator=g) < p.synth_fraction
    temps = torch.tensor(p.sample_temperatures)[torch.randint(len(p.sample_temperatures), (n,), generator=g)]
    temps = torch.where(torch.rand(n, generator=g) < p.sampled_fraction, temps, 0.0)
    noise = torch.Generator(device=target.device).manual_seed(int(torch.randint(2**62, (1,), generator=g)))
    if synth.any():  # the target writes the prompt, from a file start, at temperature 1
        k = int(synth.sum())
        start = torch.full((k, 1), eos, dtype=torch.long)
        prompts[synth] = continue_prompts(target, start, first, torch.ones(k), noise)
    rows = continue_prompts(target, prompts, first + cont, temps, noise)
    small = torch.int16 if p.vocab_size <= 32767 else torch.int32
    return {"tokens": rows.to(small), "first": first, "synth": synth, "temperature": temps}


def load(folder: Path, p: Preset, pad: int) -> Distilled:
    """The parts under `folder` as one padded Distilled (pad: the id after a row's end)."""
    tokens, first, length = [], [], []
    width = p.distill_width
    for i in range(parts(p)):
        part = torch.load(folder / part_name(i), weights_only=True)
        t = part["tokens"].long()
        n, w = t.shape
        tokens.append(torch.cat([t, torch.full((n, width - w), pad, dtype=torch.long)], dim=1))
        first.append(torch.full((n,), part["first"]))
        length.append(torch.full((n,), w))
    return Distilled(torch.cat(tokens), torch.cat(first), torch.cat(length))


def part_name(i: int) -> str:
    return f"part-{i:05d}.pt"
