"""Qwen3.5 hybrid target: Gated DeltaNet layers interleaved with gated full attention (3 : 1).

A layer is Qwen3's pre-norm block, h + mixer(norm(h)), then h + MLP(norm(h)), whose token mixer is either

* gated attention: causal GQA with q/k RMSNorm and RoPE on the first `rotary_dim` dims of each head, its output
  times sigmoid(gate), a per-head gate that q_proj emits beside the query; or
* a Gated DeltaNet: a short causal depthwise conv + SiLU over [q | k | v], q and k L2-normalised (q also by
  1/sqrt(d_k)), and per value head the delta rule with a scalar decay,
      S <- e^g S;   δ = β (v - Sᵀk);   S <- S + k δᵀ;   o = Sᵀq,
  with g = -exp(A_log) softplus(a + dt_bias), β = sigmoid(b); then a gated RMSNorm of o by silu(z) and out_proj.

Every RMSNorm scales by (1 + w) except the DeltaNet's gated one (plain w): the loader adds the one. The layers run
through Qwen3's residual stream (models/decoder.run_layers): where the GPU's products normalise their own input, the
input and post norms' weights are folded into the mixer's input product and gate_up at load (decoder.fold_norms) and
the adds and norms run inside the products (layers/fusion.py). The recurrence runs row by row in float32 on fixed
shapes (capturable; one Triton kernel per layer on CUDA), long prefills in chunks (layers/delta_rule.py); the state
and what a rewind needs live in layers/recurrent_state.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..layers import delta_rule, ops
from ..layers.kv_cache import KVCache
from ..layers.recurrent_state import HybridCache, RecurrentState
from ..layers.spans import MAX_STEP_ROWS, Span, StaticSpan
from ..loading.config import Qwen35Config
from ..loading.weights import load_tensors
from .decoder import fold_norms, read_after_qkv, run_layers
from .qwen3 import ForwardOut

TEXT = "model.language_model."  # the published multimodal checkpoints' text tower
SKIPPED = ("model.visual.", "mtp.", "model.mtp.")  # vision tower and the multi-token-prediction head: not the target


def checkpoint_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """Our tensor names (the text tower's, under model.) and their shapes."""
    h = cfg.hidden_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i, kind in enumerate(cfg.layer_types):
        shapes.update(layer_shapes(cfg, f"model.layers.{i}.", kind))
    return shapes


def layer_shapes(cfg: Qwen35Config, p: str, kind: str) -> dict[str, tuple[int, ...]]:
    """One decoder layer's tensors under prefix p: a "full_attention" or a "linear_attention" one."""
    h, d = cfg.hidden_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = {
        f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,),
        f"{p}mlp.gate_proj.weight": (cfg.intermediate_size, h), f"{p}mlp.up_proj.weight": (cfg.intermediate_size, h),
        f"{p}mlp.down_proj.weight": (h, cfg.intermediate_size),
    }
    if kind == "full_attention":
        a = f"{p}self_attn."
        shapes.update({f"{a}q_proj.weight": (2 * nh * d, h), f"{a}k_proj.weight": (nkv * d, h),
                       f"{a}v_proj.weight": (nkv * d, h), f"{a}o_proj.weight": (h, nh * d),
                       f"{a}q_norm.weight": (d,), f"{a}k_norm.weight": (d,)})
    else:
        a, hv = f"{p}linear_attn.", cfg.linear_num_value_heads
        kd, vd = cfg.linear_num_key_heads * cfg.linear_key_head_dim, hv * cfg.linear_value_head_dim
        shapes.update({f"{a}in_proj_qkv.weight": (2 * kd + vd, h), f"{a}in_proj_z.weight": (vd, h),
                       f"{a}in_proj_b.weight": (hv, h), f"{a}in_proj_a.weight": (hv, h),
                       f"{a}conv1d.weight": (2 * kd + vd, 1, cfg.linear_conv_kernel_dim),
                       f"{a}A_log": (hv,), f"{a}dt_bias": (hv,), f"{a}norm.weight": (cfg.linear_value_head_dim,),
                       f"{a}out_proj.weight": (h, vd)})
    return shapes


def rename(name: str) -> str | None:
    """A checkpoint tensor name -> ours (None: not part of the text model)."""
    if name.startswith(SKIPPED) or name.endswith("rotary_emb.inv_freq"):
        return None
    return "model." + name[len(TEXT):] if name.startswith(TEXT) else name


@dataclass
class GatedAttention:
    qkvg: torch.Tensor  # [q (H*D) | k (KV*D) | v (KV*D) | gate (H*D), hidden]: q_proj's per-head rows split apart
    o: torch.Tensor
    q_norm: torch.Tensor  # 1 + w
    k_norm: torch.Tensor

    @classmethod
    def take(cls, t: dict, p: str, cfg: Qwen35Config) -> "GatedAttention":
        nh, d = cfg.num_attention_heads, cfg.head_dim
        # q_proj's rows are [q_0 | gate_0 | q_1 | gate_1 | ...], one head_dim block each.
        q, gate = t.pop(f"{p}q_proj.weight").view(nh, 2, d, -1).unbind(1)
        return cls(qkvg=torch.cat([q.reshape(nh * d, -1), t.pop(f"{p}k_proj.weight"), t.pop(f"{p}v_proj.weight"),
                                   gate.reshape(nh * d, -1)]),
                   o=t.pop(f"{p}o_proj.weight"), q_norm=1 + t.pop(f"{p}q_norm.weight"),
                   k_norm=1 + t.pop(f"{p}k_norm.weight"))


@dataclass
class GatedDeltaNet:
    proj: torch.Tensor  # [qkv (conv_dim) | z (H_v*d_v) | b (H_v) | a (H_v), hidden]
    conv: torch.Tensor  # [conv_dim, K] depthwise, no bias
    neg_A: torch.Tensor  # -exp(A_log), float32 [H_v]
    dt_bias: torch.Tensor  # float32 [H_v]
    norm: torch.Tensor  # [d_v], plain w
    out: torch.Tensor

    @classmethod
    def take(cls, t: dict, p: str) -> "GatedDeltaNet":
        proj = torch.cat([t.pop(f"{p}in_proj_{n}.weight") for n in ("qkv", "z", "b", "a")])
        return cls(proj=proj, conv=t.pop(f"{p}conv1d.weight")[:, 0], neg_A=-t.pop(f"{p}A_log").float().exp(),
                   dt_bias=t.pop(f"{p}dt_bias").float(), norm=t.pop(f"{p}norm.weight"), out=t.pop(f"{p}out_proj.weight"))


@dataclass
class Layer:
    mixer: GatedAttention | GatedDeltaNet
    slot: int  # its index among the layers of its kind (the KV cache's layer, or the recurrent state's)
    input_norm: torch.Tensor  # 1 + w
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    norms_folded: bool = False  # input_norm / post_norm are ones, their weights inside mixer_in / gate_up (fold_norms)

    @property
    def mixer_in(self) -> torch.Tensor:
        """The weight the layer reads first: its mixer's input product (decoder.run_layers)."""
        return self.mixer.qkvg if isinstance(self.mixer, GatedAttention) else self.mixer.proj

    @classmethod
    def take(cls, t: dict, p: str, kind: str, slot: int, cfg: Qwen35Config) -> "Layer":
        """The layer under prefix p (a "full_attention" or a "linear_attention" one), its tensors popped from t."""
        mixer = (GatedAttention.take(t, p + "self_attn.", cfg) if kind == "full_attention"
                 else GatedDeltaNet.take(t, p + "linear_attn."))
        return cls(mixer, slot, 1 + t.pop(p + "input_layernorm.weight"),
                   1 + t.pop(p + "post_attention_layernorm.weight"),
                   torch.cat([t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")]),
                   t.pop(p + "mlp.down_proj.weight"))


class Qwen35Model:
    """Batch-size-1 Qwen3.5 text model. Layer states are addressed like transformers' `hidden_states` (0: the
    embeddings, i: the output of layer i-1), as Qwen3Model's, so drafters capture them the same way."""

    recurrent = True  # its cache holds a recurrent state: a verify's commit folds it (runtime/graphs.target_graphs)

    def __init__(self, cfg: Qwen35Config, tensors: dict[str, torch.Tensor], device, dtype):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.embed = tensors.pop("model.embed_tokens.weight")
        self.layers = []
        slots = {"full_attention": 0, "linear_attention": 0}
        for i, kind in enumerate(cfg.layer_types):
            self.layers.append(Layer.take(tensors, f"model.layers.{i}.", kind, slots[kind], cfg))
            slots[kind] += 1
        if ops.folds_norms(self.device, dtype):  # as Qwen3's: the GPU's products then run the layers' norms
            ones = torch.ones(cfg.hidden_size, dtype=dtype, device=self.device)
            for layer in self.layers:
                fold_norms(layer, ones)
        self.norm = 1 + tensors.pop("model.norm.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else tensors.pop("lm_head.weight")
        self.cos, self.sin = ops.rope_tables(cfg.rotary_dim, cfg.rope_theta, cfg.max_position_embeddings, self.device)

    @classmethod
    def load(cls, model_dir: Path, device="cpu", dtype=torch.float32) -> "Qwen35Model":
        cfg = Qwen35Config.load(model_dir)
        tensors = load_tensors(model_dir, checkpoint_shapes(cfg), dtype, device,
                               ignore_prefixes=("lm_head.",) if cfg.tie_word_embeddings else (), rename=rename,
                               role="target")
        return cls(cfg, tensors, device, dtype)

    def new_cache(self, max_len: int) -> HybridCache:
        c = self.cfg
        kv = KVCache.allocate(len(c.attention_layers), max_len, c.num_key_value_heads, c.head_dim, self.dtype,
                              self.device)
        conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
        state = RecurrentState(len(c.linear_layers), conv_dim, c.linear_conv_kernel_dim, c.linear_num_key_heads,
                               c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                               MAX_STEP_ROWS, self.dtype, self.device)  # a step's forward keeps its rows
        return HybridCache(kv, state)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return ops.logits(ops.rms_norm(h, self.norm, self.cfg.rms_norm_eps), self.lm_head)

    def forward(self, ids: torch.Tensor, start: int, cache: HybridCache, capture: Sequence[int] = (),
                all_logits: bool = False, hold: bool = False) -> ForwardOut:
        """Run `ids` ([T]) at positions [start, start+T): their KV into the cache, the state through them.
        hold: leave the state where it started (a verify: `commit_rows` then keeps its accepted prefix)."""
        return self.run(ids, Span(cache.kv, start, ids.shape[0], self.cos, self.sin), cache.state, capture,
                        all_logits, hold)

    def forward_static(self, ids: torch.Tensor, positions: torch.Tensor, cache: HybridCache, window: int,
                       capture: Sequence[int] = (), all_logits: bool = False, hold: bool = False) -> ForwardOut:
        """As `forward`, with the rows' positions in device memory (CUDA-graph capturable)."""
        span = StaticSpan(cache.kv, positions, window, self.cos, self.sin)
        return self.run(ids, span, cache.state, capture, all_logits, hold)

    def commit_rows(self, cache: HybridCache, n, rows: int) -> None:
        """After a held forward of `rows` rows: the state after its row n (device long [1] or int)."""
        cache.state.fold(n, rows)

    def run(self, ids, span, state: RecurrentState, capture: Sequence[int], all_logits: bool,
            hold: bool) -> ForwardOut:
        rows = ids.shape[0]
        if hold and rows > state.max_rows:
            raise ValueError(f"a held forward keeps at most {state.max_rows} rows")
        positions = getattr(span, "positions", None)  # a StaticSpan's, on the device (a hybrid's rows: consecutive)
        state.begin(span.start if positions is None else positions[:1])
        mixer = token_mixer(self.cfg, span, state, hold)
        _, x, captured = run_layers(self.layers, self.embed[ids], self.cfg.rms_norm_eps, mixer, self.norm,
                                    self.lm_head, capture)
        logits = ops.logits(x if all_logits else x[-1:], self.lm_head)
        hidden = torch.cat([captured[j] for j in capture], dim=-1) if capture else None
        return ForwardOut(logits=logits, hidden=hidden)


def token_mixer(c: Qwen35Config, span, state: RecurrentState | None = None, hold: bool = False):
    """The hybrid's token mixer for decoder.run_layers: a layer's gated attention against the span's KV layer of its
    slot, or its Gated DeltaNet from `state` (`delta_net`'s hold); then the mixer's output product."""
    def mix(index: int, layer: Layer, x: torch.Tensor, **kw):
        m = layer.mixer
        if isinstance(m, GatedAttention):
            return gated_attention(c, m, layer.slot, x, span, **kw), m.o
        return delta_net(c, m, layer.slot, x, state, hold, **kw), m.out
    return mix


def delta_net(c: Qwen35Config, m: GatedDeltaNet, slot: int, x: torch.Tensor, state: RecurrentState, hold: bool,
              norm: float | None = None, squares: torch.Tensor | None = None) -> torch.Tensor:
    """Gated DeltaNet of the rows x [T, hidden] (normed, or with `norm` the stream its folded input product normalises:
    ops.linear's norm, squares) from the state the forward began with -> [T, H_v * d_v], before out_proj.
    Unless `hold`, the state moves past the rows; a forward of at most state.max_rows rows keeps them."""
    hk, hv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    t, conv_dim = x.shape[0], m.conv.shape[0]
    mixed, z, b, a = ops.linear(x, m.proj, then=m.out, norm=norm, squares=squares).split(
        [conv_dim, hv * dv, hv, hv], dim=-1)
    kept = t <= state.max_rows
    # The short causal conv over [the previous K-1 inputs ; these rows], per channel, then SiLU.
    conv = delta_rule.short_conv(mixed, state.conv0[slot], m.conv, window=None if hold else state.conv[slot],
                                 keep=state.x[slot] if kept else None)
    q, k, v = conv.split([hk * dk, hk * dk, hv * dv], dim=-1)
    q, k, v = q.reshape(t, hk, dk), k.reshape(t, hk, dk), v.reshape(t, hv, dv)
    S = None if hold else state.S[slot]
    if kept:  # row by row (one kernel on the GPU), keeping each row's k, δ, g for a rewind
        o = delta_rule.rows(q, k, v, a, b, m.neg_A, m.dt_bias, state.S0[slot], S,
                            keep=(state.k[slot], state.delta[slot], state.g[slot]), out_dtype=x.dtype)
    else:  # a long prefill: chunks of rows at once (it keeps no rows: never held)
        q, k, v, g, beta = delta_rule.gates(q, k, v, a, b, m.neg_A, m.dt_bias)
        group = hv // hk  # value head j: key head j // group
        o, S_end = delta_rule.chunked(q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1), v, g,
                                      beta, state.S0[slot])
        state.S[slot].copy_(S_end)
    o = delta_rule.gated_rms_norm(o.to(x.dtype), z.reshape(t, hv, dv), m.norm, c.rms_norm_eps)
    return o.reshape(t, hv * dv)


def gated_attention(c: Qwen35Config, a: GatedAttention, slot: int, x: torch.Tensor, span,
                    norm: float | None = None, squares: torch.Tensor | None = None) -> torch.Tensor:
    """Gated attention of the rows x [T, hidden] (normed, or as `delta_net`'s with norm and squares) against the
    span's KV layer `slot` -> [T, H*D], before o_proj. q/k norm and the partial RoPE (the tables' rotary_dim columns)
    run in one kernel on the GPU: with the KV write, the attention and its output gate where the span can fuse them
    (`attend_fresh`, as Qwen3's decoder.self_attention)."""
    d, nh, nkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    after = read_after_qkv(a, span, slot)  # o, or over long windows the layer's cached keys and values
    q, k, v, gate = ops.linear(x, a.qkvg, then=after, norm=norm, squares=squares).split(
        [nh * d, nkv * d, nkv * d, nh * d], dim=-1)
    q, k, v = q.reshape(-1, nh, d), k.reshape(-1, nkv, d), v.reshape(-1, nkv, d)
    fused = getattr(span, "attend_fresh", None)
    if fused is None:
        q, k = ops.qk_norm_rope(q, k, a.q_norm, a.k_norm, c.rms_norm_eps, span.cos, span.sin)
        return ops.output_gate(span.attend(slot, q, k, v, d**-0.5), gate)
    return fused(slot, q, k, v, a.q_norm, a.k_norm, c.rms_norm_eps, d**-0.5, then=None if after is a.o else a.o,
                 gate=gate)
