"""The EAGLE-3 drafter: one Llama-style decoder layer fed fused low/mid/high target states.

Row p of the drafter pairs the target's state at position p (three layers'
states concatenated and projected by `fc`) with the embedding of the token at
p+1, and predicts the token at p+2. Inside the layer the normed embedding and
the normed state are concatenated (2H) into q/k/v; the residual stream is the
state. Chained steps feed the layer's own (pre-norm) output back as the state.
The head covers a reduced draft vocabulary; `d2t[i]` is the offset from draft
id i to its target id.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..layers import ops
from ..layers.kv_cache import KVCache
from ..errors import DflashError
from ..loading.config import Qwen3Config, read_json
from ..loading.weights import load_tensors

LAYER_PREFIXES = ("midlayer.", "layers.0.", "model.layers.0.")


class Eagle3Config:
    """Native layout (EAGLE / SpecForge / AngelSlim: flat Llama config + draft_vocab_size) or
    speculators' (`transformer_layer_config` nested, flags at the top level)."""

    def __init__(self, raw: dict, path: Path, target: Qwen3Config):
        self.path = path
        layer = raw.get("transformer_layer_config") or raw  # speculators nests the layer's config
        speculators = layer is not raw
        if int(layer.get("num_hidden_layers", 1)) != 1:
            raise DflashError(f"{path}: EAGLE-3 drafters with {layer.get('num_hidden_layers')} layers are not supported")
        for flag in ("fc_norm", "norm_output"):
            if raw.get(flag):
                raise DflashError(f"{path}: EAGLE-3 variant with {flag}=true is not supported")
        self.hidden = int(layer["hidden_size"])
        self.heads = int(layer["num_attention_heads"])
        self.kv_heads = int(layer.get("num_key_value_heads") or self.heads)
        # The Qwen3-4B drafters use head_dim 128 != hidden/heads: never derive it when the config names it.
        self.head_dim = int(layer.get("head_dim") or self.hidden // self.heads)
        self.intermediate = int(layer["intermediate_size"])
        self.eps = float(layer.get("rms_norm_eps", 1e-6))
        self.rope_theta = float((layer.get("rope_parameters") or {}).get("rope_theta", layer.get("rope_theta", 10000.0)))
        scaling = layer.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise DflashError(f"{path}: unsupported rope_scaling {scaling}")
        self.qk_norm = layer.get("model_type") == "qwen3"  # speculators' Qwen3-style layer has q/k norms
        self.vocab = int(layer.get("vocab_size", target.vocab_size))
        self.draft_vocab = int(raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or self.vocab)
        self.target_hidden = int(raw.get("target_hidden_size") or target.hidden_size)
        # speculators exports default to the residual taken after hidden_norm (as vLLM reads them).
        self.norm_before_residual = bool(raw.get("norm_before_residual", speculators))
        self.norm_before_fc = bool(raw.get("norm_before_fc", False))
        eagle = raw.get("eagle_config") or {}
        layers = eagle.get("eagle_aux_hidden_state_layer_ids") or raw.get("eagle_aux_hidden_state_layer_ids")
        n = target.num_hidden_layers
        # Default (EAGLE-3 paper / reference code): inputs of layers 2, L/2 and L-3, i.e. transformers'
        # hidden_states[2], [L//2], [L-3]; explicit ids follow vLLM's convention (input of layer i).
        self.aux_layers = [int(i) for i in (layers or (2, n // 2, n - 3))]
        # The chain length the drafter was made for, where its config says (speculators: its proposal method's).
        methods = (raw.get("speculators_config") or {}).get("proposal_methods") or [{}]
        chain = methods[0].get("speculative_tokens") or raw.get("num_speculative_tokens")
        self.chain_length = int(chain) if chain else None
        if self.vocab != target.vocab_size or self.target_hidden != target.hidden_size:
            raise DflashError(
                f"EAGLE-3 drafter {path.parent} was made for a different target: vocabulary {self.vocab} vs "
                f"{target.vocab_size}, hidden size {self.target_hidden} vs {target.hidden_size}")
        if self.hidden != target.hidden_size:
            raise DflashError(f"{path}: drafter hidden size {self.hidden} differs from the target's embeddings")
        if max(self.aux_layers) >= n or min(self.aux_layers) < 0:
            raise DflashError(f"{path}: auxiliary layer {max(self.aux_layers)} does not exist in the target")

    def checkpoint_shapes(self, prefix: str = "midlayer.") -> dict[str, tuple[int, ...]]:
        h, d = self.hidden, self.head_dim
        a = prefix + "self_attn."
        return {
            "fc.weight": (h, len(self.aux_layers) * self.target_hidden),
            a + "q_proj.weight": (self.heads * d, 2 * h),
            a + "k_proj.weight": (self.kv_heads * d, 2 * h),
            a + "v_proj.weight": (self.kv_heads * d, 2 * h),
            a + "o_proj.weight": (h, self.heads * d),
            prefix + "mlp.gate_proj.weight": (self.intermediate, h),
            prefix + "mlp.up_proj.weight": (self.intermediate, h),
            prefix + "mlp.down_proj.weight": (h, self.intermediate),
            prefix + "hidden_norm.weight": (h,),
            prefix + "input_layernorm.weight": (h,),
            prefix + "post_attention_layernorm.weight": (h,),
            "norm.weight": (h,),
            "lm_head.weight": (self.draft_vocab, h),
            **({a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)} if self.qk_norm else {}),
            **({"input_norm.weight": (len(self.aux_layers) * self.target_hidden,)} if self.norm_before_fc else {}),
        }

    def identity_maps(self, device) -> dict[str, torch.Tensor]:
        """d2t/t2d for a drafter whose head covers the first draft_vocab target ids (synthetic use)."""
        t2d = torch.zeros(self.vocab, dtype=torch.bool, device=device)
        t2d[: self.draft_vocab] = True
        return {"d2t": torch.zeros(self.draft_vocab, dtype=torch.int64, device=device), "t2d": t2d}


class Eagle3Drafter:
    def __init__(self, c: Eagle3Config, t: dict[str, torch.Tensor], target, source: str = "drafter"):
        self.c, self.target = c, target
        self.device, self.dtype = target.device, target.dtype
        p, a = "midlayer.", "midlayer.self_attn."
        self.fc = t.pop("fc.weight")
        self.qkv = torch.cat([t.pop(a + "q_proj.weight"), t.pop(a + "k_proj.weight"), t.pop(a + "v_proj.weight")])
        self.o = t.pop(a + "o_proj.weight")
        self.gate_up = torch.cat([t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")])
        self.down = t.pop(p + "mlp.down_proj.weight")
        self.hidden_norm = t.pop(p + "hidden_norm.weight")
        self.input_norm = t.pop(p + "input_layernorm.weight")
        self.post_norm = t.pop(p + "post_attention_layernorm.weight")
        self.norm = t.pop("norm.weight")
        self.q_norm = t.pop(a + "q_norm.weight", None)
        self.k_norm = t.pop(a + "k_norm.weight", None)
        self.fc_input_norm = t.pop("input_norm.weight", None)
        self.lm_head = t.pop("lm_head.weight")
        self.embed = t.pop("embed_tokens.weight", None)
        if self.embed is None:
            self.embed = target.embed
        d2t = t.pop("d2t", None)
        base = torch.arange(c.draft_vocab, device=self.device)
        # Draft id -> target id (checkpoints store the offset d2t[i] = target_id - i).
        self.draft_to_target = base + d2t.to(device=self.device, dtype=torch.long) if d2t is not None else base
        if int(self.draft_to_target.max()) >= c.vocab or int(self.draft_to_target.min()) < 0:
            raise DflashError(f"{source}: d2t maps draft ids outside the target vocabulary")
        self.scale = c.head_dim**-0.5
        # Hidden-state indices as in transformers' `hidden_states`: the input of layer i is index i.
        self.capture = tuple(c.aux_layers)
        self.width, self.vocab = c.hidden, c.vocab  # a fused state's features; the target's vocabulary

    @classmethod
    def load(cls, path: Path, target) -> "Eagle3Drafter":
        path = Path(path)
        raw = read_json(path / "config.json", "drafter config")
        c = Eagle3Config(raw, path / "config.json", target.cfg)
        shapes = c.checkpoint_shapes()
        shapes["d2t"] = (c.draft_vocab,)
        shapes["t2d"] = (c.vocab,)
        shapes["embed_tokens.weight"] = (c.vocab, c.hidden)

        def rename(name: str) -> str | None:
            if name.startswith("model.") and not name.startswith("model.layers."):
                name = name[len("model.") :]
            for prefix in LAYER_PREFIXES:
                if name.startswith(prefix):
                    return "midlayer." + name[len(prefix) :]
            return name

        tensors = load_tensors(path, shapes, target.dtype, target.device,
                               optional={"d2t", "t2d", "embed_tokens.weight"}, rename=rename,
                               ignore_prefixes=("midlayer.self_attn.rotary_emb",), role="EAGLE-3 drafter")
        return cls(c, tensors, target, str(path))

    def new_cache(self, rows: int) -> KVCache:
        """The layer's KV cache of `rows` positions."""
        c = self.c
        return KVCache.allocate(1, rows, c.kv_heads, c.head_dim, self.dtype, self.device)

    def rope_tables(self, rows: int):
        return ops.rope_tables(self.c.head_dim, self.c.rope_theta, rows, self.device)

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target states [m, 3H] -> the drafter's fused states [m, H]."""
        if self.fc_input_norm is not None:
            hidden = ops.rms_norm(hidden, self.fc_input_norm, self.c.eps)
        return ops.linear(hidden, self.fc)

    def rows(self, span, state: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Run the layer on the span's rows (writing their KV); returns pre-norm outputs."""
        c = self.c
        n = state.shape[0]
        emb = ops.rms_norm(self.embed[next_ids], self.input_norm, c.eps)
        normed = ops.rms_norm(state, self.hidden_norm, c.eps)
        x = torch.cat([emb, normed], dim=-1)
        q, k, v = ops.linear(x, self.qkv).split([c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                                c.kv_heads * c.head_dim], dim=-1)
        cos, sin = span.cos, span.sin
        q, k = q.reshape(n, c.heads, c.head_dim), k.reshape(n, c.kv_heads, c.head_dim)
        if self.q_norm is not None:
            q, k = ops.rms_norm(q, self.q_norm, c.eps), ops.rms_norm(k, self.k_norm, c.eps)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        attn = span.attend(0, q, k, v.reshape(n, c.kv_heads, c.head_dim), self.scale)
        h = (normed if c.norm_before_residual else state) + ops.linear(attn, self.o)
        x = ops.rms_norm(h, self.post_norm, c.eps)
        return h + ops.linear(ops.swiglu(x, self.gate_up), self.down)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of pre-norm outputs."""
        return ops.logits(ops.rms_norm(out, self.norm, self.c.eps), self.lm_head)
