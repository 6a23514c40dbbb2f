"""Qwen3.5's multi-token-prediction layer (MTP), shipped inside every Qwen3.5 checkpoint (`mtp.*`), as a drafter.

Row t of the MTP pairs H_t, the target's final normed state at committed position t, with the token x_{t+1} after it:

    h   = fc([pre_fc_norm_embedding(embed(x_{t+1})) ; pre_fc_norm_hidden(H_t)])     (the embedding first)
    h   = one full-attention Qwen3.5 decoder layer (gated attention, its own KV cache; the row sits at position t,
          RoPE as the target's)
    out = norm(h);   lm_head(out) drafts x_{t+2}

The embedding and the head are the target's (`mtp_use_dedicated_embeddings` false), every RMSNorm is (1 + w).
Chained, `out` (normed) takes H's place in the next row (position t+1, fed the drafted token).

Checked against vLLM: vllm/model_executor/models/qwen3_5_mtp.py (Qwen3_5MultiTokenPredictor.forward: the two
pre-fc norms, cat([embedding, hidden]), fc, the layer, norm; the shared embed_tokens / lm_head);
vllm/model_executor/models/qwen3_next.py (Qwen3NextModel.forward returns the target's state after its final norm);
vllm/v1/spec_decode/llm_base_proposer.py (the first pass shifts the ids by one and keeps the target's positions; a
model that returns one tensor, as the MTP does, chains that normed output as the next step's hidden state).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DflashError
from ..layers import ops
from ..layers.kv_cache import KVCache
from ..loading.config import Qwen35Config, read_json
from ..loading.weights import load_tensors, tensor_files
from .decoder import fold_norms, run_layers
from .qwen35 import Layer, layer_shapes, token_mixer

PREFIXES = ("mtp.", "model.mtp.")  # some exports put the MTP under model.


def checkpoint_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """The MTP's tensors (our names, under mtp.) and their shapes."""
    h = cfg.hidden_size
    return {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
            "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,),
            **layer_shapes(cfg, "mtp.layers.0.", "full_attention")}


def require_mtp(cfg, path: Path, name: str) -> None:
    """--draft mtp's checks, before anything loads: a Qwen3.5 config (`cfg`) whose checkpoint (`path`) ships the MTP."""
    if not isinstance(cfg, Qwen35Config):
        raise DflashError(f"--draft mtp needs a Qwen3.5 model, whose checkpoint ships a multi-token-prediction layer: "
                          f"{name} has none (use a drafter of its own, or --draft none)")
    if not has_mtp(path):
        raise DflashError(f"{name} ships no multi-token-prediction weights (mtp.*): --draft mtp needs them")


def rename(name: str) -> str | None:
    """A checkpoint tensor name -> ours (None: the target's, the vision tower's, derived rotary tables)."""
    if name.endswith("rotary_emb.inv_freq"):
        return None
    if name.startswith("model.mtp."):
        return name[len("model."):]
    return name if name.startswith("mtp.") else None


def has_mtp(model_dir: Path) -> bool:
    """Whether the checkpoint in model_dir ships MTP weights."""
    return any(name.startswith(PREFIXES) for name in tensor_files(model_dir, "target"))


class MtpDrafter:
    """The MTP network over a loaded Qwen35Model target (whose embedding, head and final norm it shares)."""

    draft_to_target = None  # its head is the target's: drafts are target ids

    def __init__(self, tensors: dict[str, torch.Tensor], target):
        cfg: Qwen35Config = target.cfg
        self.cfg, self.target = cfg, target
        self.device, self.dtype = target.device, target.dtype
        self.fc = tensors.pop("mtp.fc.weight")
        self.embedding_norm = 1 + tensors.pop("mtp.pre_fc_norm_embedding.weight")
        self.hidden_norm = 1 + tensors.pop("mtp.pre_fc_norm_hidden.weight")
        self.norm = 1 + tensors.pop("mtp.norm.weight")
        self.layer = Layer.take(tensors, "mtp.layers.0.", "full_attention", 0, cfg)
        if ops.folds_norms(self.device, self.dtype):  # as the target's layers: the GPU's products run its norms
            fold_norms(self.layer, torch.ones(cfg.hidden_size, dtype=self.dtype, device=self.device))
        self.embed, self.lm_head = target.embed, target.lm_head
        # H_t: the target's last layer's output (its hidden state L), normed here by the target's final norm, the
        # very product its logits read (Qwen35Model keeps that norm apart: nothing folds it into the head).
        self.capture = (cfg.num_hidden_layers,)
        self.width, self.vocab = cfg.hidden_size, cfg.vocab_size

    @classmethod
    def load(cls, path: Path, target) -> "MtpDrafter":
        """The MTP of the target checkpoint in `path` (its mtp.* tensors; the target loader skips them)."""
        path = Path(path)
        cfg = target.cfg
        require_mtp(cfg, path, str(path))
        raw = read_json(path / "config.json", "model config")
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
        layers = int(text.get("mtp_num_hidden_layers", 1))
        if layers != 1:
            raise DflashError(f"{path}: an MTP of {layers} layers is not supported (only mtp_num_hidden_layers 1)")
        if text.get("mtp_use_dedicated_embeddings"):
            raise DflashError(f"{path}: an MTP with its own embeddings (mtp_use_dedicated_embeddings) is not supported")
        tensors = load_tensors(path, checkpoint_shapes(cfg), target.dtype, target.device, rename=rename,
                               role="MTP layer")
        return cls(tensors, target)

    def new_cache(self, rows: int) -> KVCache:
        c = self.cfg
        return KVCache.allocate(1, rows, c.num_key_value_heads, c.head_dim, self.dtype, self.device)

    def rope_tables(self, rows: int):
        c = self.cfg
        return ops.rope_tables(c.rotary_dim, c.rope_theta, rows, self.device)

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's captured last-layer states [m, H] -> H, after its final norm."""
        return ops.rms_norm(hidden, self.target.norm, self.cfg.rms_norm_eps)

    def rows(self, span, state: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """The MTP over the span's rows: states [n, H] (normed) with the next tokens [n] -> normed outputs [n, H]
        (each row's KV written into the span's cache)."""
        eps = self.cfg.rms_norm_eps
        emb = ops.rms_norm(self.embed[next_ids], self.embedding_norm, eps)
        h = ops.linear(torch.cat([emb, ops.rms_norm(state, self.hidden_norm, eps)], dim=-1), self.fc)
        # The layer as the target's run (decoder.run_layers), then its final norm; the head reads next.
        _, out, _ = run_layers([self.layer], h, eps, token_mixer(self.cfg, span), self.norm, self.lm_head)
        return out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """float32 logits over the target's vocabulary of normed outputs."""
        return ops.logits(out, self.lm_head)
