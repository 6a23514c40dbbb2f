"""Qwen3 dense target model running spans of tokens against a static KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..layers import ops
from ..layers.kv_cache import KVCache
from ..layers.spans import Span, StaticSpan
from ..loading.config import Qwen3Config
from ..loading.weights import load_tensors
from .decoder import DecoderLayer, attention, fold_norms, layer_shapes, run_layers


def checkpoint_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    for i in range(cfg.num_hidden_layers):
        shapes.update(layer_shapes(cfg, f"model.layers.{i}."))
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


@dataclass
class ForwardOut:
    logits: torch.Tensor | None  # [T or 1, vocab] float32
    hidden: torch.Tensor | None  # [T, len(capture) * hidden]: captured layer states, concatenated
    verdict: torch.Tensor | None = None  # set by the engine where asked: ops.greedy_verdict of the rows


class Qwen3Model:
    """Batch-size-1 Qwen3. Layer states are addressed like transformers' `hidden_states`:
    index 0 is the embedding output, index i the output of layer i-1."""

    def __init__(self, cfg: Qwen3Config, tensors: dict[str, torch.Tensor], device, dtype):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.embed = tensors.pop("model.embed_tokens.weight")
        self.layers = [DecoderLayer.take(tensors, f"model.layers.{i}.") for i in range(cfg.num_hidden_layers)]
        self.norm = tensors.pop("model.norm.weight")
        if ops.folds_norms(self.device, dtype):  # the GPU's products then run the layers' norms inside them
            ones = torch.ones(cfg.hidden_size, dtype=dtype, device=self.device)
            for layer in self.layers:
                fold_norms(layer, ones)
        self.lm_head = self.embed if cfg.tie_word_embeddings else tensors.pop("lm_head.weight")
        self.scale = cfg.head_dim**-0.5
        # Every position the model has, once: graphs read the tables in place (Qwen3-4B: 42 MB in float32).
        self.cos, self.sin = ops.rope_tables(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings, self.device)

    @classmethod
    def load(cls, model_dir: Path, device="cpu", dtype=torch.float32) -> "Qwen3Model":
        cfg = Qwen3Config.load(model_dir)
        tensors = load_tensors(
            model_dir,
            checkpoint_shapes(cfg),
            dtype,
            device,
            # Tied checkpoints sometimes still carry a copy of the head; rotary buffers are derived.
            ignore_prefixes=("lm_head.",) if cfg.tie_word_embeddings else (),
            rename=lambda n: None if n.endswith("rotary_emb.inv_freq") else n,
            role="target",
        )
        return cls(cfg, tensors, device, dtype)

    def new_cache(self, max_len: int) -> KVCache:
        c = self.cfg
        return KVCache.allocate(c.num_hidden_layers, max_len, c.num_key_value_heads, c.head_dim, self.dtype, self.device)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return ops.logits(ops.rms_norm(h, self.norm, self.cfg.rms_norm_eps), self.lm_head)

    def forward(
        self,
        ids: torch.Tensor,
        start: int,
        cache: KVCache,
        capture: Sequence[int] = (),
        all_logits: bool = False,
    ) -> ForwardOut:
        """Run `ids` ([T]) at positions [start, start+T), writing their KV into `cache`.

        Returns logits of the last position (or of all with `all_logits`) and the
        states named in `capture`, concatenated along the feature axis.
        """
        return self.run(ids, Span(cache, start, ids.shape[0], self.cos, self.sin), capture, all_logits)

    def forward_static(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, window: int,
                       capture: Sequence[int] = (), all_logits: bool = False) -> ForwardOut:
        """As `forward`, with the rows' positions in device memory (CUDA-graph capturable)."""
        span = StaticSpan(cache, positions, window, self.cos, self.sin)
        return self.run(ids, span, capture, all_logits)

    def run(self, ids: torch.Tensor, span, capture: Sequence[int], all_logits: bool) -> ForwardOut:
        mixer = attention(self.cfg, span, self.scale)
        _, x, captured = run_layers(self.layers, self.embed[ids], self.cfg.rms_norm_eps, mixer, self.norm,
                                    self.lm_head, capture)
        logits = ops.logits(x if all_logits else x[-1:], self.lm_head)
        # After the head: a torch copy kernel between the last norm and the head would stall the head's
        # early weight loads (programmatic dependent launch) on the GPU.
        hidden = torch.cat([captured[j] for j in capture], dim=-1) if capture else None
        return ForwardOut(logits=logits, hidden=hidden)
