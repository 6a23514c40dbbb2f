"""The DFlash block-diffusion drafter (z-lab checkpoints, e.g. z-lab/Qwen3-4B-DFlash-b16).

One forward fills a block [last committed token, mask, mask, ...] at once. Its
keys/values are the block's own plus context rows: the target's hidden states
from `target_layer_ids` (concatenated, projected by `fc`, normed by
`hidden_norm`), each layer projecting them with its own k/v weights, k-normed
and rotated at their absolute positions. Attention is non-causal, except in
sliding-window layers (`layer_types`), which are causal inside the block and
see only keys less than `sliding_window` positions before the query
(`LayerAttention`; docs/dflash-sliding-window.md says why). Context rows are
cached across steps; only newly committed tokens' rows are appended.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import tuning
from ..layers import ops
from ..errors import DflashError
from ..loading.config import Qwen3Config, read_json
from ..loading.weights import load_tensors
from .decoder import DecoderLayer, attention, fold_norms, layer_shapes, project_kv, run_layers

DFLASH2_MARKERS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
LAYER_TYPES = ("full_attention", "sliding_attention")
# What a sliding layer computes differs between z-lab's releases (docs/dflash-sliding-window.md). We follow the PyPI
# `dflash` 0.1.0 reference, vLLM and SGLang: a sliding layer is causal inside the block and a block row at position p
# sees keys at positions > p - sliding_window; full layers are non-causal; a config's `is_causal` (or
# dflash_config's `is_causal` / `causal`) sets every layer's causality. z-lab's GitHub code before 0.1.0 kept every
# layer non-causal and applied the window under flash-attn only.
SLIDING_SEMANTICS = "dflash-0.1.0"


@dataclass(frozen=True)
class LayerAttention:
    """Which keys a drafter layer's block rows see. causal: block row i sees the block's rows up to i (else the whole
    block); window: keys at positions p - window < key position (and, non-causal, < p + window), None: all."""

    type: str
    causal: bool
    window: int | None = None


def layer_attention(raw: dict, block: dict, layers: int, path: Path,
                    window: int | None = None) -> tuple[tuple[LayerAttention, ...], str]:
    """Each layer's LayerAttention from the config's layer_types / sliding_window / use_sliding_window / is_causal,
    as transformers' Qwen3Config and the 0.1.0 reference read them (the window only with use_sliding_window; without
    layer_types, the layers from max_window_layers on slide), and the rule that set their causality. window: a
    window for the layers that have none (the DFLASH_DRAFT_WINDOW knob: bounds a full-attention drafter's context
    cost on long prompts)."""
    size = raw.get("sliding_window") if raw.get("use_sliding_window") else None
    types = raw.get("layer_types")
    if types is None:
        first = int(raw.get("max_window_layers", 28) or 0)  # transformers' default
        types = ["sliding_attention" if size is not None and i >= first else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise DflashError(f"{path}: layer_types must list one type for each of the {layers} layers")
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise DflashError(f"{path}: unsupported drafter layer type(s) {', '.join(map(str, unknown))} "
                          f"(a DFlash drafter layer is {' or '.join(LAYER_TYPES)})")
    for name, w in (("sliding_window", size), ("DFLASH_DRAFT_WINDOW", window)):
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise DflashError(f"{path}: {name} must be a positive number of keys (got {w!r})")
    forced = block.get("is_causal", raw.get("is_causal", block.get("causal")))
    if forced is not None:
        rule = f"is_causal={bool(forced)} from the config: every layer"
    else:
        rule = f"{SLIDING_SEMANTICS}: sliding layers causal inside the block, full layers non-causal"
    out = []
    for t in types:
        causal = bool(forced) if forced is not None else t == "sliding_attention"
        w = size if t == "sliding_attention" else None
        out.append(LayerAttention(t, causal, w if w is not None else window))
    return tuple(out), rule


def is_dflash2(raw: dict) -> bool:
    """Whether a drafter config.json is a DFlash 2 one (models/dflash2.py): its architecture or its module sizes."""
    arch, block = raw.get("architectures") or [], raw.get("dflash_config") or {}
    return any(a.startswith("DFlash2") for a in arch) or any(k in block or k in raw for k in DFLASH2_MARKERS)


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default spread of target layers when the config names none."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


class DFlashConfig:
    dflash2 = False  # DFlash 2's config (models/dflash2.py) reads these fields and its own

    def __init__(self, raw: dict, path: Path, window: int | None = None):
        """window: a sliding window for every layer that has none (layer_attention)."""
        arch = raw.get("architectures") or []
        block = raw.get("dflash_config") or {}
        if is_dflash2(raw) and not self.dflash2:
            raise DflashError(f"{path} is a DFlash 2 drafter (dynamic convolutions, candidate selector): "
                              "load it as one (--draft dflash2, or its folder)")
        if arch and not any("DFlash" in a for a in arch):
            raise DflashError(f"{path} is not a DFlash drafter (architectures: {', '.join(arch)})")
        self.model = Qwen3Config.from_dict(raw, path, sliding=True)
        get = lambda k, d=None: block.get(k, raw.get(k, d))  # noqa: E731 - dflash_config first, then top level
        self.num_target_layers = int(get("num_target_layers", 0)) or None
        layers = get("target_layer_ids")
        if layers is None:
            if not self.num_target_layers:
                raise DflashError(f"{path}: no target_layer_ids and no num_target_layers")
            layers = default_target_layers(self.num_target_layers, self.model.num_hidden_layers)
        self.target_layer_ids = [int(i) for i in layers]
        self.block_size = int(get("block_size", 16))
        mask = get("mask_token_id")
        if mask is None:
            raise DflashError(f"{path}: dflash_config has no mask_token_id")
        self.mask_token_id = int(mask)
        self.embedding_scale = float(get("input_embedding_scale", 1.0))
        self.output_multiplier = float(get("output_multiplier", 1.0))
        softcap = get("final_logit_softcapping")
        self.softcap = float(softcap) if softcap else None
        # Per layer: causal inside the block or not, and its window; `attention_rule` names what set them.
        self.attention, self.attention_rule = layer_attention(raw, block, self.model.num_hidden_layers, path, window)

    @property
    def layer_masks(self) -> tuple[LayerAttention, ...] | None:
        """The spans' per-layer masks, or None where every layer is the plain non-causal, unwindowed block (the
        spans' `causal=False` alone)."""
        if all(not a.causal and a.window is None for a in self.attention):
            return None
        return self.attention


def checkpoint_shapes(c: DFlashConfig) -> dict[str, tuple[int, ...]]:
    m = c.model
    shapes = {"fc.weight": (m.hidden_size, len(c.target_layer_ids) * m.hidden_size),
              "hidden_norm.weight": (m.hidden_size,), "norm.weight": (m.hidden_size,)}
    for i in range(m.num_hidden_layers):
        shapes.update(layer_shapes(m, f"layers.{i}."))
    return shapes


class DFlashDrafter:
    def __init__(self, c: DFlashConfig, tensors: dict[str, torch.Tensor], target, source: str = "drafter",
                 fold: bool = True):
        """fold: fold the norms where the GPU runs them inside the products (`_fold_norms`); training passes False,
        since a folded drafter's context rows no longer read the layers' k/v rows or hidden_norm."""
        _check_target(c, target, source)
        self.c, self.cfg, self.target = c, c.model, target
        self.device, self.dtype = target.device, target.dtype
        self.fc = tensors.pop("fc.weight")
        self.hidden_norm = tensors.pop("hidden_norm.weight")
        self.norm = tensors.pop("norm.weight")
        self.layers = [DecoderLayer.take(tensors, f"layers.{i}.") for i in range(self.cfg.num_hidden_layers)]
        self.scale = self.cfg.head_dim**-0.5
        # Hidden-state indices as in transformers' `hidden_states` (layer i's output is i+1).
        self.capture = tuple(i + 1 for i in c.target_layer_ids)
        self.ctx_kv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # stacked k/v rows, made on first use
        self.ctx_k_norms: torch.Tensor | None = None
        self.norms_folded = False
        if fold and ops.folds_norms(self.device, self.dtype):  # as the target's: the GPU's products run
            self._fold_norms()  # the norms

    def _fold_norms(self) -> None:
        """The layers' norm weights into their products (decoder.fold_norms), and hidden_norm's into the stacked
        context k/v product. The context rows' keys and values skip the layers' input norm (they are projected
        from hidden_norm's output), so that product is stacked first, from the layers' unfolded k/v rows."""
        self._stack_ctx_kv()
        self.ctx_kv[0].mul_(self.hidden_norm)
        ones = torch.ones(self.cfg.hidden_size, dtype=self.dtype, device=self.device)
        for layer in self.layers:
            fold_norms(layer, ones)
        self.norms_folded = True

    def _stack_ctx_kv(self) -> None:
        """Every layer's k/v rows (and biases) stacked into one weight, once."""
        if self.ctx_kv is not None:
            return
        m = self.cfg
        q_rows = m.num_attention_heads * m.head_dim
        bias = None
        if self.layers[0].qkv_bias is not None:
            bias = torch.cat([layer.qkv_bias[q_rows:] for layer in self.layers])
        self.ctx_kv = (torch.cat([layer.qkv[q_rows:] for layer in self.layers]), bias)
        self.ctx_k_norms = torch.stack([layer.k_norm for layer in self.layers])

    @classmethod
    def load(cls, path: Path, target, window: int | None = None) -> "DFlashDrafter":
        """window: a sliding window for the layers that have none (DFlashConfig; None: tuning's DFLASH_DRAFT_WINDOW)."""
        path = Path(path)
        window = tuning.KNOBS.draft_window if window is None else window
        c = DFlashConfig(read_json(path / "config.json", "drafter config"), path / "config.json", window)
        # Some exports prefix the drafter's own tensors with "model."; embeddings/head are the target's.
        tensors = load_tensors(path, checkpoint_shapes(c), target.dtype, target.device,
                               ignore_prefixes=("lm_head.", "embed_tokens.", "model.embed_tokens."),
                               rename=lambda n: n[6:] if n.startswith("model.") else n, role="DFlash drafter")
        return cls(c, tensors, target, source=str(path))

    @property
    def block_size(self) -> int:
        return self.c.block_size

    def context_rows(self, hidden: torch.Tensor, span, stacked: bool = False) -> None:
        """Project target states into each layer's context keys/values and write them through `span`.

        stacked: every layer's k/v projection as one product over a stacked copy of their weights (made on
        first use). Per step a few rows are absorbed, and one weight stream beats 2 x layers small ones. With the
        norms folded (`_fold_norms`) the stacked product is the only one that has the context's weights, and
        hidden_norm runs inside it."""
        m = self.cfg
        if self.norms_folded:
            kv = ops.linear(ops.linear(hidden, self.fc), *self.ctx_kv, norm=m.rms_norm_eps)
        else:
            ctx = ops.rms_norm(ops.linear(hidden, self.fc), self.hidden_norm, m.rms_norm_eps)
            if not stacked:  # training runs this path: its parameters are the layers' own tensors
                for i, layer in enumerate(self.layers):
                    k, v = project_kv(layer, ctx, m)
                    span.write(i, ops.apply_rope(k, span.cos, span.sin), v)
                return
            self._stack_ctx_kv()
            kv = ops.linear(ctx, *self.ctx_kv)
        # Per layer [keys | values]: [T, layers, 2, KV, D]; all layers' norm, RoPE and writes in one kernel.
        kv = kv.view(hidden.shape[0], len(self.layers), 2, m.num_key_value_heads, m.head_dim)
        span.write_layers(kv[:, :, 0], kv[:, :, 1], self.ctx_k_norms, m.rms_norm_eps)

    def block_logits(self, block: torch.Tensor, span) -> torch.Tensor:
        # Row 0 holds the last committed token: only the mask rows after it are drafts.
        return self.normed_logits(self.block_states(block, span, final_norm=True)[1:])

    def block_states(self, block: torch.Tensor, span, final_norm: bool = False) -> torch.Tensor:
        """The layers over the block rows: their outputs before the final norm (training runs many blocks at
        once), or with `final_norm` after it, the last residual add fused with that norm."""
        # The block's keys/values land in the cache after the context; absorb overwrites them later.
        m, c = self.cfg, self.c
        h = self.target.embed[block]
        if c.embedding_scale != 1.0:
            h = h * c.embedding_scale
        h, x, _ = run_layers(self.layers, h, m.rms_norm_eps, attention(m, span, self.scale),
                             self.norm if final_norm else None, self.target.lm_head)
        return x if final_norm else h

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.normed_logits(ops.rms_norm(h, self.norm, self.cfg.rms_norm_eps))

    def normed_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of rows already through the final norm."""
        c = self.c
        logits = ops.logits(x, self.target.lm_head)
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        if c.softcap:
            logits = torch.tanh(logits / c.softcap) * c.softcap
        return logits


def _check_target(c: DFlashConfig, target, source: str) -> None:
    t = target.cfg
    problems = []
    if c.model.hidden_size != t.hidden_size:
        problems.append(f"hidden size {c.model.hidden_size} vs {t.hidden_size}")
    if c.model.vocab_size != t.vocab_size:
        problems.append(f"vocabulary {c.model.vocab_size} vs {t.vocab_size}")
    if c.num_target_layers and c.num_target_layers != t.num_hidden_layers:
        problems.append(f"{c.num_target_layers} target layers vs {t.num_hidden_layers}")
    if max(c.target_layer_ids) >= t.num_hidden_layers:
        problems.append(f"target layer {max(c.target_layer_ids)} does not exist")
    if not 0 <= c.mask_token_id < t.vocab_size:
        problems.append(f"mask token {c.mask_token_id} outside the vocabulary")
    if problems:
        raise DflashError(f"DFlash drafter {source} was made for a different target: " + "; ".join(problems))
