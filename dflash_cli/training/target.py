"""The demo target: a small Qwen3, trained on next-token prediction over the token stream."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..layers import ops
from ..loading.config import Qwen3Config
from ..models.qwen3 import Qwen3Model, checkpoint_shapes
from .params import init_tensors, save, target_tensors, target_trainable
from .presets import Preset
from .spans import CausalBatch


def config(p: Preset, eos_id: int) -> dict:
    """config.json as transformers writes it for Qwen3ForCausalLM."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": p.vocab_size,
        "hidden_size": p.hidden, "intermediate_size": p.intermediate, "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads, "num_key_value_heads": p.kv_heads, "head_dim": p.head_dim,
        "hidden_act": "silu", "max_position_embeddings": p.context, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
        "use_cache": True, "use_sliding_window": False, "sliding_window": None, "max_window_layers": p.layers,
        "initializer_range": 0.02, "bos_token_id": eos_id, "eos_token_id": eos_id, "torch_dtype": "bfloat16",
    }


def build(p: Preset, eos_id: int, seed: int, device) -> tuple[Qwen3Model, list[torch.nn.Parameter]]:
    raw = config(p, eos_id)
    cfg = Qwen3Config.from_dict(raw, Path("config.json"))
    tensors = init_tensors(checkpoint_shapes(cfg), torch.Generator().manual_seed(seed), p.layers)
    tensors = {k: v.to(device) for k, v in tensors.items()}
    model = Qwen3Model(cfg, tensors, device, torch.float32)
    return model, target_trainable(model)


def step_seconds(p: Preset, device) -> float:
    """What one training step of p's target takes on `device`, from one timed row of its batch (a step's cost is
    about linear in its rows: 1, 2, 4 and 8 rows of the demo's took 1.2-1.4 s a row on one CPU core). A few seconds
    on a CPU; the weights are random, and no generator the run draws from is touched."""
    model, _ = build(p, 0, 0, device)
    row = torch.randint(0, p.vocab_size, (1, p.context + 1), generator=torch.Generator().manual_seed(0)).to(device)
    with ops.reference_only():
        loss(model, row[:, :65]).backward()  # warm-up: the first backward's allocations
        t0 = time.perf_counter()
        loss(model, row).backward()
        return (time.perf_counter() - t0) * p.target_batch


def windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows of `length` tokens from a 1-D token stream."""
    starts = torch.randint(0, stream.numel() - length, (n,), generator=gen)
    return stream[starts[:, None] + torch.arange(length)].long()


def loss(model: Qwen3Model, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of [b, t+1] token windows."""
    b, t = batch.shape[0], batch.shape[1] - 1
    out = model.run(batch[:, :-1].reshape(-1), CausalBatch(b, t, model.cos, model.sin), (), all_logits=True)
    return F.cross_entropy(out.logits, batch[:, 1:].reshape(-1))


@torch.no_grad()
def held_out_loss(model: Qwen3Model, stream: torch.Tensor, length: int, batch: int = 8) -> float:
    """Cross-entropy over consecutive windows of the held-out stream (up to 64 windows)."""
    n = min(64, (stream.numel() - 1) // length)
    total = 0.0
    for i in range(0, n, batch):
        rows = [stream[j * length : j * length + length + 1] for j in range(i, min(n, i + batch))]
        total += float(loss(model, torch.stack(rows).long().to(model.device))) * len(rows)
    return total / max(n, 1)


def export(model: Qwen3Model, p: Preset, eos_id: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(p, eos_id), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos_id, "eos_token_id": [eos_id], "pad_token_id": eos_id, "do_sample": False}, indent=2) + "\n")
    save(target_tensors(model), out / "model.safetensors", torch.bfloat16)
