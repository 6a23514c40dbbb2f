"""Training a DFlash 2 candidate selector (models/dflash2.CandidateSelector) over the frozen DFlash drafter, and
writing the pair as a DFlash 2 drafter whose convolutions are the identity (base kernel 1 on the row itself, 0 on
the row before, no correction): the block drafter's states and logits unchanged, the selector's walk on top.

Examples are the drafter's block rows at random anchors of the target's continuations (training/dflash.anchors),
each with its final-norm state, its top-K candidates and their logits, and the token before it (the anchor's for
the block's first row): teacher forcing, the condition under which a draft counts (the one before it accepted, that
is, equal to the target's token). The label is the target's own distribution over those candidates (its logits at
that position, the whole prefix seen), not the one token the continuation took: the loss is the cross-entropy of
softmax(score / T) against softmax(target logit / T) at T 1 and at the demo's sampling temperature, so that the
walk's softmax(scores / T), the q of a sampled draft, follows the target's p at T (lossless rejection sampling
accepts sum(min(p, q))), and its argmax the target's greedy token."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..layers import ops
from ..models.dflash import DFlashDrafter
from .distill import Distilled
from .params import save
from .presets import CONV_GROUP, CONV_TAPS
from . import dflash as dflash_stage

# The soft labels' temperatures: the target's own distribution, and the demo's sampling temperature (the issue's).
TEMPERATURES = (1.0, 0.6)


def build(vocab: int, hidden: int, rank: int, seed: int) -> list[torch.nn.Parameter]:
    """[predecessor codebook A [V, R], successor codebook B [V, R], hidden projection W [R, H]]."""
    g = torch.Generator().manual_seed(seed)
    shapes = ((vocab, rank, 0.1), (vocab, rank, 0.1), (rank, hidden, hidden ** -0.5))
    return [torch.nn.Parameter(std * torch.randn(*shape, generator=g)) for *shape, std in shapes]


def examples(drafter: DFlashDrafter, data: Distilled, anchors: int, top_k: int, gen: torch.Generator) -> dict:
    """The frozen drafter's block rows (kept anchors only): x [N, H] (after the final norm), cand / unary [N, K] (its
    top-K and their logits), target [N, K] (the target's logits of those candidates), prev [N] (the token before)."""
    size = drafter.block_size
    with torch.no_grad():
        at, keep = dflash_stage.anchors(data, size, anchors, gen)
        h, target_logits = dflash_stage.block_states(drafter, data.tokens, at, target_logits=True)
        x = ops.rms_norm(h, drafter.norm, drafter.cfg.rms_norm_eps).reshape(-1, h.shape[-1])
        unary, cand = torch.topk(drafter.normed_logits(x), top_k, dim=-1)
        b, n = at.shape
        # row j of a block predicts the token at anchor + j + 1 from the prefix up to anchor + j
        pos = (at[:, :, None] + torch.arange(size - 1, device=at.device)).reshape(b, -1)
        target = target_logits.gather(1, pos[:, :, None].expand(-1, -1, target_logits.shape[-1]))
        target = target.reshape(-1, target.shape[-1]).gather(1, cand)
        prev = data.tokens.gather(1, pos).reshape(-1)
        kept = keep[:, :, None].expand(-1, -1, size - 1).reshape(-1)
    return {"x": x[kept].float(), "cand": cand[kept], "unary": unary[kept].float(), "target": target[kept].float(),
            "prev": prev[kept]}


def scores(params: list[torch.Tensor], ex: dict) -> torch.Tensor:
    """score(p -> c) = logit[c] + < A[p] * (W x), B[c] > for each example's candidates [N, K]."""
    a, b, w = params
    context = a[ex["prev"]] * (ex["x"] @ w.T)
    return ex["unary"] + torch.einsum("nr,nkr->nk", context, b[ex["cand"]])


def loss(params: list[torch.Tensor], drafter: DFlashDrafter, data: Distilled, anchors: int, top_k: int,
         gen: torch.Generator):
    """The soft-label cross-entropy at TEMPERATURES; metrics: how often the walk's pick is the target's greedy token
    among the candidates, with the selector and without (the block's own argmax)."""
    ex = examples(drafter, data, anchors, top_k, gen)
    s = scores(params, ex).float()
    total = sum(-(torch.softmax(ex["target"] / t, -1) * torch.log_softmax(s / t, -1)).sum(-1).mean()
                for t in TEMPERATURES)
    with torch.no_grad():
        best = ex["target"].argmax(-1)
        picked = (s.argmax(-1) == best).float().mean()
        alone = (ex["unary"].argmax(-1) == best).float().mean()
    return total, {"pick": picked, "argmax": alone}


def export(drafter_dir: Path, out: Path, params: list[torch.Tensor], top_k: int) -> None:
    """drafter_dir's DFlash drafter with identity convolutions and the selector, as a DFlash 2 drafter (z-lab's
    layout: the four sizes in dflash_config, the codebooks without `.weight`)."""
    from safetensors.torch import load_file

    cfg = json.loads((drafter_dir / "config.json").read_text())
    tensors = load_file(str(drafter_dir / "model.safetensors"))
    hidden = cfg["hidden_size"]
    for i in range(cfg["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, CONV_TAPS, hidden)
            base[:, 0] = 1.0
            tensors[f"layers.{i}.{conv}.base_kernel"] = base
            tensors[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.zeros(
                2 * CONV_TAPS * hidden // CONV_GROUP, hidden)
    a, b, w = params
    tensors.update({"candidate_selector.predecessor_codebook": a, "candidate_selector.successor_codebook": b,
                    "candidate_selector.hidden_projection.weight": w})
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"].update(conv_kernel_size=CONV_TAPS, conv_group_size=CONV_GROUP, selector_rank=a.shape[1],
                                selector_top_k=top_k)
    out.mkdir(parents=True, exist_ok=True)
    save(tensors, out / "model.safetensors", torch.bfloat16)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
