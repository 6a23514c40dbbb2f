"""Training the DFlash drafter: fill whole blocks of mask tokens in one pass, conditioned on the
target's hidden states before the block, against the tokens the target produced (DFlash paper:
many blocks per sequence, random anchors, loss weights decaying along the block)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..layers import ops
from ..models.dflash import DFlashConfig, DFlashDrafter, checkpoint_shapes
from .params import dflash_tensors, init_tensors, layer_trainable, make_trainable, save
from .presets import Preset
from .spans import CausalBatch, DFlashBlocks
from .target import config as target_config


def config(p: Preset, eos_id: int, mask_id: int) -> dict:
    """z-lab's layout: the target's Qwen3 config with the drafter's depth and a dflash_config block."""
    return dict(target_config(p, eos_id), architectures=["DFlashDraftModel"], num_hidden_layers=p.dflash_layers,
                num_target_layers=p.layers, block_size=p.block_size,
                dflash_config={"mask_token_id": mask_id, "target_layer_ids": list(p.dflash_target_layers)})


def build(p: Preset, target, eos_id: int, mask_id: int, seed: int) -> tuple[DFlashDrafter, list]:
    c = DFlashConfig(config(p, eos_id, mask_id), Path("config.json"))
    tensors = init_tensors(checkpoint_shapes(c), torch.Generator().manual_seed(seed), p.dflash_layers)
    drafter = DFlashDrafter(c, {k: v.to(target.device) for k, v in tensors.items()}, target, fold=False)
    params = make_trainable(drafter, ["fc", "hidden_norm", "norm"])
    for layer in drafter.layers:
        params += layer_trainable(layer)
    return drafter, params


def block_logits(drafter: DFlashDrafter, seqs: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Draft logits [b, n, size-1, V] of the blocks anchored at `anchors` [b, n] (the last committed
    token's position); each block sees the target's states before its anchor."""
    target, size = drafter.target, drafter.block_size
    b, length = seqs.shape
    with torch.no_grad():
        hidden = target.run(seqs.reshape(-1), CausalBatch(b, length, target.cos, target.sin), drafter.capture,
                            False).hidden
    m = drafter.cfg
    cos, sin = ops.rope_tables(m.head_dim, m.rope_theta, length + size, seqs.device)  # a block may pass the end
    spans = DFlashBlocks(anchors, length, size, cos, sin)
    drafter.context_rows(hidden, spans.ctx)
    block = torch.full((b, anchors.shape[1], size), drafter.c.mask_token_id, dtype=torch.long, device=seqs.device)
    block[:, :, 0] = seqs.gather(1, anchors)
    h = drafter.block_states(block.reshape(-1), spans.block).reshape(b, anchors.shape[1], size, -1)[:, :, 1:]
    return drafter.head_logits(h.reshape(-1, h.shape[-1])).reshape(b, anchors.shape[1], size - 1, -1)


def loss(drafter: DFlashDrafter, seqs: torch.Tensor, first: int, blocks: int, gen: torch.Generator):
    """seqs [b, L] (target continuations from position `first`); returns (loss, metrics)."""
    size = drafter.block_size
    b, length = seqs.shape
    # Anchors in the target's own continuation: the labels are tokens the target produced.
    anchors = torch.randint(first - 1, length - size + 1, (b, blocks), generator=gen).to(seqs.device)
    logits = block_logits(drafter, seqs, anchors).reshape(-1, drafter.cfg.vocab_size)
    labels = seqs.gather(1, (anchors[:, :, None] + torch.arange(1, size, device=seqs.device)).reshape(b, -1))
    ce = F.cross_entropy(logits, labels.reshape(-1), reduction="none").reshape(b, blocks, size - 1)
    k = torch.arange(size - 1, device=seqs.device, dtype=torch.float32)
    w = torch.exp(-k / max(1.0, (size - 1) / 2))  # earlier positions gate everything after them
    hit = (logits.argmax(-1) == labels.reshape(-1)).reshape(b, blocks, size - 1).float()
    return (ce * w).sum() / (w.sum() * b * blocks), {"acc1": hit[..., 0].mean()}


def export(drafter: DFlashDrafter, p: Preset, eos_id: int, mask_id: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(p, eos_id, mask_id), indent=2) + "\n")
    save(dflash_tensors(drafter), out / "model.safetensors", torch.bfloat16)
