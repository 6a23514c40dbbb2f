"""Training the DFlash drafter: fill whole blocks of mask tokens in one pass, conditioned on the
target's hidden states before the block, against the tokens the target produced. As z-lab's recipe
(SpecForge specforge/core/dflash.py, OnlineDFlashModel): many blocks per sequence at distinct random
anchors among the target's own tokens, each block [anchor token, mask, ...] seeing the context strictly
before its anchor and its own rows, the frozen target embedding and head, and a cross-entropy weighted
exp(-(k-1)/gamma) at block position k."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..layers import ops
from ..loading.weights import load_tensors
from ..models.dflash import DFlashConfig, DFlashDrafter, checkpoint_shapes
from .params import dflash_tensors, init_tensors, layer_trainable, make_trainable, save
from .distill import Distilled
from .presets import Preset, loss_gamma
from .spans import CausalBatch, DFlashBlocks
from .target import config as target_config


def config(p: Preset, eos_id: int, mask_id: int, block: int | None = None) -> dict:
    """z-lab's layout: the target's Qwen3 config with the drafter's depth and a dflash_config block."""
    return dict(target_config(p, eos_id), architectures=["DFlashDraftModel"], num_hidden_layers=p.dflash_layers,
                num_target_layers=p.layers, block_size=block or p.block_size,
                dflash_config={"mask_token_id": mask_id, "target_layer_ids": list(p.dflash_target_layers)})


def build(p: Preset, target, eos_id: int, mask_id: int, seed: int, block: int | None = None,
          start: Path | None = None) -> tuple[DFlashDrafter, list]:
    """A trainable drafter of block size `block` (the preset's by default): fresh, or from the drafter in `start`
    (its weights do not depend on the block size)."""
    c = DFlashConfig(config(p, eos_id, mask_id, block), Path("config.json"))
    if start is None:
        tensors = init_tensors(checkpoint_shapes(c), torch.Generator().manual_seed(seed), p.dflash_layers)
    else:
        tensors = load_tensors(start, checkpoint_shapes(c), torch.float32, "cpu", role="DFlash drafter")
    drafter = DFlashDrafter(c, {k: v.to(target.device) for k, v in tensors.items()}, target, fold=False)
    params = make_trainable(drafter, ["fc", "hidden_norm", "norm"])
    for layer in drafter.layers:
        params += layer_trainable(layer)
    return drafter, params


def block_logits(drafter: DFlashDrafter, seqs: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Draft logits [b, n, size-1, V] of the blocks anchored at `anchors` [b, n] (the last committed
    token's position); each block sees the target's states before its anchor."""
    h = block_states(drafter, seqs, anchors)
    return drafter.head_logits(h.reshape(-1, h.shape[-1])).reshape(*h.shape[:3], -1)


def block_states(drafter: DFlashDrafter, seqs: torch.Tensor, anchors: torch.Tensor, target_logits: bool = False):
    """The draft rows' states [b, n, size-1, H] before the final norm (block_logits'); with target_logits, also the
    target's logits at every position of seqs [b, length, V] (from the same forward)."""
    target, size = drafter.target, drafter.block_size
    b, length = seqs.shape
    with torch.no_grad():
        out = target.run(seqs.reshape(-1), CausalBatch(b, length, target.cos, target.sin), drafter.capture,
                         target_logits)
    hidden = out.hidden
    m = drafter.cfg
    cos, sin = ops.rope_tables(m.head_dim, m.rope_theta, length + size, seqs.device)  # a block may pass the end
    spans = DFlashBlocks(anchors, length, size, cos, sin)
    drafter.context_rows(hidden, spans.ctx)
    block = torch.full((b, anchors.shape[1], size), drafter.c.mask_token_id, dtype=torch.long, device=seqs.device)
    block[:, :, 0] = seqs.gather(1, anchors)
    states = drafter.block_states(block.reshape(-1), spans.block).reshape(b, anchors.shape[1], size, -1)[:, :, 1:]
    return (states, out.logits.view(b, length, -1)) if target_logits else states


def anchors(data: Distilled, size: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n distinct random anchors per row among the positions whose whole block lies in the target's own tokens
    (anchor from the prompt's last token to length - size), sorted; keep [b, n] is false where a row has fewer
    than n such positions (SpecForge's _sample_anchor_positions: a random order of the valid positions)."""
    b, width = data.tokens.shape
    pos = torch.arange(width)
    first, length = data.first.cpu()[:, None], data.length.cpu()[:, None]
    valid = (pos >= first - 1) & (pos <= length - size)
    order = torch.rand(b, width, generator=gen).masked_fill(~valid, 2.0).argsort(dim=1)[:, :n].sort(dim=1).values
    keep = valid.gather(1, order)
    return torch.where(keep, order, first - 1).to(data.tokens.device), keep.to(data.tokens.device)


def loss(drafter: DFlashDrafter, data: Distilled, blocks: int, gen: torch.Generator, gamma: float | None = None):
    """data: a batch of the target's continuations; returns (loss, metrics)."""
    size = drafter.block_size
    gamma = gamma or loss_gamma(size)
    seqs = data.tokens
    b = seqs.shape[0]
    at, keep = anchors(data, size, blocks, gen)
    logits = block_logits(drafter, seqs, at).reshape(-1, drafter.cfg.vocab_size)
    labels = seqs.gather(1, (at[:, :, None] + torch.arange(1, size, device=seqs.device)).reshape(b, -1))
    ce = F.cross_entropy(logits, labels.reshape(-1), reduction="none").reshape(b, blocks, size - 1)
    k = torch.arange(1, size, device=seqs.device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma) * keep[:, :, None]  # SpecForge specforge/core/dflash.py: exp(-(k-1)/gamma)
    hit = (logits.argmax(-1) == labels.reshape(-1)).reshape(b, blocks, size - 1).float()
    first_hit = (hit[..., 0] * keep).sum() / keep.sum().clamp_min(1)
    return (ce * w).sum() / w.sum().clamp_min(1e-6), {"acc1": first_hit}


def export(drafter: DFlashDrafter, p: Preset, eos_id: int, mask_id: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(p, eos_id, mask_id, drafter.block_size), indent=2) + "\n")
    save(dflash_tensors(drafter), out / "model.safetensors", torch.bfloat16)
