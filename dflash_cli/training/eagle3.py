"""Training the EAGLE-3 drafter with training-time test: the layer is unrolled over several chained
steps, each step fed the previous step's own output state (as at inference), with the attention
pattern of a drafter KV cache (spans.Eagle3Steps). Step losses are weighted 0.8^j."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..layers import ops
from ..models.eagle3 import Eagle3Config, Eagle3Drafter
from .params import eagle3_tensors, init_tensors, make_trainable, save
from .presets import Preset
from .spans import CausalBatch, Eagle3Steps

FIELDS = ["fc", "qkv", "o", "gate_up", "down", "hidden_norm", "input_norm", "post_norm", "norm", "lm_head"]


def config(p: Preset) -> dict:
    """The native EAGLE-3 layout (EAGLE / SpecForge / AngelSlim): a one-layer Llama config."""
    taps = {"eagle_aux_hidden_state_layer_ids": list(p.eagle3_layers)} if p.eagle3_layers else {}
    return {**taps, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": p.hidden, "intermediate_size": p.intermediate, "num_attention_heads": p.heads,
            "num_key_value_heads": p.kv_heads, "head_dim": p.head_dim, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": p.context, "vocab_size": p.vocab_size,
            "draft_vocab_size": p.draft_vocab, "target_hidden_size": p.hidden, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def draft_vocab(seqs: torch.Tensor, size: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `size` most frequent target ids in the distillation data (sorted) and the t2d mask."""
    counts = torch.bincount(seqs.reshape(-1), minlength=vocab)
    ids = counts.topk(size).indices.sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids, t2d


def build(p: Preset, target, ids: torch.Tensor, seed: int) -> tuple[Eagle3Drafter, list]:
    c = Eagle3Config(config(p), Path("config.json"), target.cfg)
    shapes = c.checkpoint_shapes()
    tensors = init_tensors(shapes, torch.Generator().manual_seed(seed), 1)
    tensors["d2t"] = ids - torch.arange(len(ids))
    drafter = Eagle3Drafter(c, {k: v.to(target.device) for k, v in tensors.items()}, target)
    params = make_trainable(drafter, FIELDS)
    return drafter, params


def step_logits(drafter: Eagle3Drafter, seqs: torch.Tensor, steps: int):
    """Yields draft-vocabulary logits [b, L-2, Vd] of each unrolled step. Row t pairs the target
    state at t with token t+1 and predicts token t+2; at step j it is the j-th draft of a chain
    started at t-j (rows t < j have no such chain)."""
    target = drafter.target
    b, length = seqs.shape
    t = length - 2
    with torch.no_grad():
        hidden = target.run(seqs[:, :t].reshape(-1), CausalBatch(b, t, target.cos, target.sin), drafter.capture,
                            False).hidden
    state = ops.linear(hidden, drafter.fc)
    nxt = seqs[:, 1 : t + 1].reshape(-1)
    c = drafter.c
    span = Eagle3Steps(b, t, *ops.rope_tables(c.head_dim, c.rope_theta, t, seqs.device))
    for _ in range(steps):
        out = drafter.rows(span, state, nxt)
        yield drafter.logits(out).reshape(b, t, -1)
        # The next step's state at t is this step's output at t-1: the chain moves one position on.
        out = out.reshape(b, t, -1)
        state = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1).reshape(b * t, -1)


def loss(drafter: Eagle3Drafter, seqs: torch.Tensor, produced: torch.Tensor, steps: int, to_draft: torch.Tensor):
    """Weighted cross-entropy of every step against the target's tokens (in draft ids); produced [b, L]: the
    positions the target wrote (prompts and padding are no labels)."""
    labels = to_draft[seqs[:, 2:]]  # [b, L-2]; -100 where the token is outside the draft vocabulary
    labels[~produced[:, 2:]] = -100
    total, weights, metrics = 0.0, 0.0, {}
    for j, logits in enumerate(step_logits(drafter, seqs, steps)):
        lab = labels.clone()
        lab[:, :j] = -100
        lab = lab.reshape(-1)
        logits = logits.reshape(lab.shape[0], -1)
        total = total + 0.8**j * F.cross_entropy(logits, lab, ignore_index=-100)
        weights += 0.8**j
        if j in (0, steps - 1):
            metrics[f"acc{j + 1}"] = (logits.argmax(-1) == lab)[lab != -100].float().mean()
    return total / weights, metrics


def export(drafter: Eagle3Drafter, p: Preset, t2d: torch.Tensor, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(p), indent=2) + "\n")
    save(eagle3_tensors(drafter, t2d), out / "model.safetensors", torch.bfloat16)
