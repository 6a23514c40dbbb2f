"""Random-weight models with the exact shapes of published checkpoints (no download).

Used to measure what the engine costs per step on any GPU; results are labelled synthetic.
"""

from __future__ import annotations

import torch

from .loading.config import Qwen3Config
from .models.qwen3 import Qwen3Model, checkpoint_shapes

# config.json fields of the published Qwen3 checkpoints that shape the computation.
QWEN3_SHAPES = {
    "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}


def qwen3_config(name: str, **over) -> Qwen3Config:
    fields = dict(QWEN3_SHAPES[name], model_type="qwen3", rms_norm_eps=1e-6, rope_theta=1000000.0,
                  max_position_embeddings=40960)
    fields.update(over)
    return Qwen3Config.from_dict(fields, path=f"<synthetic {name}>")


def random_tensors(shapes: dict[str, tuple[int, ...]], device, dtype, seed: int = 0, std: float = 0.02,
                   head_std: float = 0.05) -> dict[str, torch.Tensor]:
    """Normal(0, std) matrices, norms near 1; the head is wider so greedy choices are not all near-ties."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            t = 1.0 + 0.05 * torch.randn(shape, generator=g, device=device)
        else:
            s = head_std if ("lm_head" in name or "embed_tokens" in name) else std
            t = s * torch.randn(shape, generator=g, device=device)
        out[name] = t.to(dtype)
    return out


def random_qwen3(name: str, device, dtype, seed: int = 0, **over) -> Qwen3Model:
    cfg = qwen3_config(name, **over)
    return Qwen3Model(cfg, random_tensors(checkpoint_shapes(cfg), device, dtype, seed), device, dtype)
