"""Between the inference classes and training: random initial tensors by checkpoint name, the
fused tensors made trainable parameters, and the checkpoint tensors (published names) back."""

from __future__ import annotations

import math

import torch

from ..models.decoder import DecoderLayer

LAYER_FIELDS = ("qkv", "o", "gate_up", "down", "input_norm", "post_norm", "q_norm", "k_norm")


def init_tensors(shapes: dict[str, tuple[int, ...]], gen: torch.Generator, layers: int,
                 std: float = 0.02) -> dict[str, torch.Tensor]:
    """Norm weights 1; matrices N(0, std), the ones writing into the residual stream scaled down
    by depth (GPT-2 style) so the stream's variance does not grow with the layer count."""
    out = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        else:
            s = std / math.sqrt(2 * layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
            out[name] = torch.randn(shape, generator=gen) * s
    return out


def make_trainable(obj, names) -> list[torch.nn.Parameter]:
    params = []
    for n in names:
        p = torch.nn.Parameter(getattr(obj, n).detach().clone().float())
        setattr(obj, n, p)
        params.append(p)
    return params


def layer_trainable(layer: DecoderLayer) -> list[torch.nn.Parameter]:
    return make_trainable(layer, LAYER_FIELDS)


def target_trainable(model) -> list[torch.nn.Parameter]:
    tied = model.lm_head is model.embed
    params = make_trainable(model, ["embed", "norm"] + ([] if tied else ["lm_head"]))
    if tied:
        model.lm_head = model.embed
    for layer in model.layers:
        params += layer_trainable(layer)
    return params


def freeze(params) -> None:
    for p in params:
        p.requires_grad_(False)


def layer_tensors(layer: DecoderLayer, cfg, prefix: str) -> dict[str, torch.Tensor]:
    d, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    q, k, v = layer.qkv.split([nh * d, nkv * d, nkv * d])
    gate, up = layer.gate_up.chunk(2)
    a = prefix + "self_attn."
    return {a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v, a + "o_proj.weight": layer.o,
            a + "q_norm.weight": layer.q_norm, a + "k_norm.weight": layer.k_norm,
            prefix + "mlp.gate_proj.weight": gate, prefix + "mlp.up_proj.weight": up,
            prefix + "mlp.down_proj.weight": layer.down, prefix + "input_layernorm.weight": layer.input_norm,
            prefix + "post_attention_layernorm.weight": layer.post_norm}


def target_tensors(model) -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm}
    for i, layer in enumerate(model.layers):
        out.update(layer_tensors(layer, model.cfg, f"model.layers.{i}."))
    if model.lm_head is not model.embed:
        out["lm_head.weight"] = model.lm_head
    return out


def dflash_tensors(drafter) -> dict[str, torch.Tensor]:
    out = {"fc.weight": drafter.fc, "hidden_norm.weight": drafter.hidden_norm, "norm.weight": drafter.norm}
    for i, layer in enumerate(drafter.layers):
        out.update(layer_tensors(layer, drafter.cfg, f"layers.{i}."))
    return out


def eagle3_tensors(drafter, t2d: torch.Tensor) -> dict[str, torch.Tensor]:
    c = drafter.c
    q, k, v = drafter.qkv.split([c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim])
    gate, up = drafter.gate_up.chunk(2)
    p, a = "midlayer.", "midlayer.self_attn."
    d2t = drafter.draft_to_target - torch.arange(c.draft_vocab, device=drafter.draft_to_target.device)
    return {"fc.weight": drafter.fc, a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v,
            a + "o_proj.weight": drafter.o, p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": drafter.down, p + "hidden_norm.weight": drafter.hidden_norm,
            p + "input_layernorm.weight": drafter.input_norm, p + "post_attention_layernorm.weight": drafter.post_norm,
            "norm.weight": drafter.norm, "lm_head.weight": drafter.lm_head, "d2t": d2t, "t2d": t2d}


def save(tensors: dict[str, torch.Tensor], path, dtype: torch.dtype) -> None:
    """Write a safetensors file; float tensors in `dtype`, index maps as they are."""
    from safetensors.torch import save_file

    out = {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu()).contiguous()
           for k, v in tensors.items()}
    save_file(out, str(path), metadata={"format": "pt"})
