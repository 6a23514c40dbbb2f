"""The Qwen3 decoder layer's weights and sub-blocks, shared by the target and the DFlash drafter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers import ops
from ..layers.fusion import Fusion, Residual, plan
from ..loading.config import Qwen3Config


def layer_shapes(cfg: Qwen3Config, prefix: str, qk_norm: bool = True) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes of one decoder layer under `prefix`."""
    h, d = cfg.hidden_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes = {
        f"{prefix}self_attn.q_proj.weight": (q_out, h),
        f"{prefix}self_attn.k_proj.weight": (kv_out, h),
        f"{prefix}self_attn.v_proj.weight": (kv_out, h),
        f"{prefix}self_attn.o_proj.weight": (h, q_out),
        f"{prefix}mlp.gate_proj.weight": (cfg.intermediate_size, h),
        f"{prefix}mlp.up_proj.weight": (cfg.intermediate_size, h),
        f"{prefix}mlp.down_proj.weight": (h, cfg.intermediate_size),
        f"{prefix}input_layernorm.weight": (h,),
        f"{prefix}post_attention_layernorm.weight": (h,),
    }
    if qk_norm:
        shapes[f"{prefix}self_attn.q_norm.weight"] = (d,)
        shapes[f"{prefix}self_attn.k_norm.weight"] = (d,)
    if cfg.attention_bias:
        shapes[f"{prefix}self_attn.q_proj.bias"] = (q_out,)
        shapes[f"{prefix}self_attn.k_proj.bias"] = (kv_out,)
        shapes[f"{prefix}self_attn.v_proj.bias"] = (kv_out,)
    return shapes


@dataclass
class DecoderLayer:
    """One layer with q/k/v and gate/up fused, so each is one matrix read per step."""

    qkv: torch.Tensor  # [(H + 2*KV) * D, hidden]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor  # [2 * I, hidden]
    down: torch.Tensor
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    norms_folded: bool = False  # input_norm / post_norm are ones, their weights inside qkv / gate_up (`fold_norms`)

    @property
    def mixer_in(self) -> torch.Tensor:
        """The weight the layer reads first (its attention's input product: `run_layers`)."""
        return self.qkv

    @classmethod
    def take(cls, t: dict[str, torch.Tensor], prefix: str) -> "DecoderLayer":
        """Build from loaded tensors, removing them from `t` so each is held once."""
        a = f"{prefix}self_attn."
        bias = None
        if f"{a}q_proj.bias" in t:
            bias = torch.cat([t.pop(f"{a}{n}_proj.bias") for n in "qkv"])
        return cls(
            qkv=torch.cat([t.pop(f"{a}{n}_proj.weight") for n in "qkv"]),
            qkv_bias=bias,
            o=t.pop(f"{a}o_proj.weight"),
            gate_up=torch.cat([t.pop(f"{prefix}mlp.gate_proj.weight"), t.pop(f"{prefix}mlp.up_proj.weight")]),
            down=t.pop(f"{prefix}mlp.down_proj.weight"),
            input_norm=t.pop(f"{prefix}input_layernorm.weight"),
            post_norm=t.pop(f"{prefix}post_attention_layernorm.weight"),
            q_norm=t.pop(f"{a}q_norm.weight"),
            k_norm=t.pop(f"{a}k_norm.weight"),
        )


def fold_norms(layer, ones: torch.Tensor) -> None:
    """Multiply the two norms' weights into the columns of the products after them (the mixer's input product
    `mixer_in`: qkv here; gate_up; rounded once) and leave ones in their place: the GPU then runs each norm inside its
    product (`run_layers`), and every other path normalises with a unit weight, which computes what the folded weights
    expect. Any layer of `run_layers` (a Qwen3.5 one too)."""
    layer.mixer_in.mul_(layer.input_norm)
    layer.gate_up.mul_(layer.post_norm)
    layer.input_norm, layer.post_norm, layer.norms_folded = ones, ones, True


def mlp_rows(layer: DecoderLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up as the fused SwiGLU product reads it, gate row j beside up row j: the `then` of the product
    before it (ops.linear)."""
    return tuple(layer.gate_up.chunk(2))


# Windows of more keys than this warm the layer's first cached keys and values into L2 from the qkv product instead
# of the o projection's first rows: it won at ctx 8192 and lost at ctx 4096 and shorter (docs/TUNING.md).
KV_WARM_WINDOW = 6144


def run_layers(layers: list, h: torch.Tensor, eps: float, mixer, final_norm: torch.Tensor | None,
               read_after: torch.Tensor, capture=()):
    """Pre-norm layers over the residual stream h [T, hidden] (the embeddings) -> (h after the last layer, its
    rms_norm by final_norm or None, {i: h after layer i - 1 for i in capture}; 0 is h itself).
    A layer holds input_norm, post_norm, gate_up, down, norms_folded and mixer_in (the weight its token mixer reads
    first); mixer(i, layer, x, **kw) -> (layer i's token mixer output before its output product, that product's
    weight), x as `Fusion.read` hands it (kw: the first product's norm and squares). Qwen3's layers (`attention`) and
    Qwen3.5's two kinds (models/qwen35.token_mixer) run here alike.
    read_after: the weight read after the layers (the GPU warms its first rows into L2)."""
    fusion = plan(h, layers[0].mixer_in, layers[0].norms_folded, eps)
    s = Residual(h)
    captured = {0: s} if 0 in capture else {}
    # Each product names the weight read after it (`then`): the GPU warms that weight's first rows into L2.
    reads_next = [layer.mixer_in for layer in layers[1:]] + [read_after]
    for i, layer in enumerate(layers):
        s = decoder_layer(i, layer, s, fusion, mixer, reads_next[i])
        if i + 1 in capture:
            captured[i + 1] = s  # complete once the next layer has read it
    x = fusion.final(s, final_norm)
    return s.h, x, {i: r.settle() for i, r in captured.items()}


def decoder_layer(index: int, layer, s: Residual, fusion: Fusion, mixer, then) -> Residual:
    """h + Mixer(RMSNorm(h)), then h + MLP(RMSNorm(h)): MLP(x) = down(silu(gate x) * up x). `fusion` places each
    norm and add (layers/fusion.py); `mixer` as `run_layers`'; `then`: the weight read after this layer."""
    x, kw = fusion.read(s, layer.input_norm)
    out, weight = mixer(index, layer, x, **kw)
    s = fusion.add(s, out, weight, fusion.attention_out, then=mlp_rows(layer))
    x, kw = fusion.read(s, layer.post_norm)
    act = ops.swiglu(x, layer.gate_up, then=layer.down, **kw)
    return fusion.add(s, act, layer.down, fusion.mlp_out, then=then)


def attention(cfg: Qwen3Config, span, scale: float):
    """Qwen3's token mixer for `run_layers`: layer i's self-attention against the span's KV layer i, then o."""
    def mix(index: int, layer: DecoderLayer, x: torch.Tensor, **kw):
        return self_attention(layer, x, cfg, span, index, scale, **kw), layer.o
    return mix


def self_attention(layer: DecoderLayer, x: torch.Tensor, cfg: Qwen3Config, span, index: int,
                   scale: float, norm: float | None = None, squares: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, hidden] (normed, or with `norm` (eps) the residual stream of a layer whose norm weight is folded,
    `squares` its partial sums of squares where the product before left them: ops.linear)
    -> attention output [T, H*D] before o_proj: project, q/k norm + RoPE, write the span's KV, attend. Spans that
    can fuse the norm, RoPE and KV write do (`attend_fresh`)."""
    fused = getattr(span, "attend_fresh", None)
    if fused is None:
        q, k, v = project_qkv_rope(layer, x, cfg, span.cos, span.sin, norm, squares)
        return span.attend(index, q, k, v, scale)
    d, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    after = read_after_qkv(layer, span, index)
    q, k, v = ops.linear(x, layer.qkv, layer.qkv_bias, then=after, norm=norm,
                         squares=squares).split([nh * d, nkv * d, nkv * d], dim=-1)
    return fused(index, q.reshape(-1, nh, d), k.reshape(-1, nkv, d), v.reshape(-1, nkv, d), layer.q_norm,
                 layer.k_norm, cfg.rms_norm_eps, scale, then=None if after is layer.o else layer.o)


def read_after_qkv(layer, span, index: int):
    """What the qkv product warms into L2 after its own loads (ops.linear's `then`): the o projection's first rows,
    or over a window of more than KV_WARM_WINDOW keys the first rows of the layer's cached keys and values, which
    the attention reads next (see KV_WARM_WINDOW). layer: what holds o (a DecoderLayer, Qwen3.5's GatedAttention);
    index: its KV cache layer."""
    if getattr(span, "window", 0) > KV_WARM_WINDOW:
        return span.cache.k[index], span.cache.v[index]
    return layer.o


def project_qkv_rope(layer: DecoderLayer, x: torch.Tensor, cfg: Qwen3Config, cos, sin, norm: float | None = None,
                     squares: torch.Tensor | None = None):
    """x: [T, hidden] (already normed, or as in `self_attention`) -> q [T, H, D], k, v [T, KV, D]; q/k normed and
    rotated at the rows' positions (cos/sin [T, D]); one fused kernel for both on the GPU."""
    d, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    qkv = ops.linear(x, layer.qkv, layer.qkv_bias, then=layer.o, norm=norm, squares=squares)
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    q, k = ops.qk_norm_rope(q.reshape(-1, nh, d), k.reshape(-1, nkv, d), layer.q_norm, layer.k_norm,
                            cfg.rms_norm_eps, cos, sin)
    return q, k, v.reshape(-1, nkv, d)


def project_kv(layer: DecoderLayer, x: torch.Tensor, cfg: Qwen3Config):
    """Keys/values only (normed k, no RoPE) — for context rows that never query."""
    d, nh = cfg.head_dim, cfg.num_attention_heads
    b = layer.qkv_bias[nh * d :] if layer.qkv_bias is not None else None
    return split_kv(layer, ops.linear(x, layer.qkv[nh * d :], b), cfg)


def split_kv(layer: DecoderLayer, kv: torch.Tensor, cfg: Qwen3Config):
    """A layer's projected [T, 2*KV*D] keys|values -> (normed k [T, KV, D], v [T, KV, D])."""
    d, nkv = cfg.head_dim, cfg.num_key_value_heads
    k, v = kv.split([nkv * d, nkv * d], dim=-1)
    k = ops.rms_norm(k.reshape(-1, nkv, d), layer.k_norm, cfg.rms_norm_eps)
    return k, v.reshape(-1, nkv, d)
