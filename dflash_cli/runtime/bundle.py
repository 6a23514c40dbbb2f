"""Everything one command needs to generate: device, dtype, target model, tokenizer, defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import DflashError
from .sampling import SamplingParams
from ..registry import SAMPLED_KEYS, ModelEntry
from ..loading.config import Qwen3Config, Qwen35Config, read_json, target_config
from ..loading.tokenizer import ChatTokenizer

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float32": torch.float32, "fp32": torch.float32}


def pick_device(name: str | None) -> torch.device:
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DflashError(f"unknown --device '{name}' (use cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DflashError("--device cuda asked for, but no CUDA device is available")
    if dev.type not in ("cpu", "cuda"):
        raise DflashError(f"unsupported --device '{name}' (use cpu, cuda or cuda:N)")
    return dev


def pick_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if not name:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise DflashError(f"unknown --dtype '{name}' (use bfloat16, float16 or float32)")
    return DTYPES[name]


@dataclass
class Bundle:
    entry: ModelEntry
    target_dir: Path
    cfg: Qwen3Config
    tokenizer: ChatTokenizer
    device: torch.device
    dtype: torch.dtype
    model: object = None  # Qwen3Model or Qwen35Model (by the config), once load_model() ran

    def context_limit(self) -> int:
        limit = self.cfg.max_position_embeddings
        return min(limit, self.entry.context) if self.entry.context else limit

    def sampling_defaults(self) -> dict:
        """Registry values first, then the checkpoint's generation_config.json."""
        out = {}
        gen = self.target_dir / "generation_config.json"
        if gen.is_file():
            raw = read_json(gen, "generation config")
            if raw.get("do_sample", True):
                out = {k: raw[k] for k in SAMPLED_KEYS if k in raw}
        out.update(self.entry.generation)
        return out

    def sampling(self, temperature, top_p, top_k, seed) -> SamplingParams:
        """Flags first (None: unset), then the model's recommended defaults; greedy when nothing says otherwise."""
        d = self.sampling_defaults()
        temperature = d.get("temperature", 0.0) if temperature is None else temperature
        top_p = d.get("top_p", 1.0) if top_p is None else top_p
        top_k = d.get("top_k", 0) if top_k is None else top_k
        return SamplingParams(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k), seed=seed)

    def load_model(self):
        """Load the target weights (the slow part; callers validate input first)."""
        if self.model is None:
            try:
                self.model = target_class(self.cfg).load(self.target_dir, device=self.device, dtype=self.dtype)
            except torch.cuda.OutOfMemoryError:
                raise DflashError(f"not enough {self.device} memory to load {self.entry.target.ref} in {self.dtype}") from None
        return self.model


def target_class(cfg: Qwen3Config):
    """The model class that runs a target of this config: Qwen3, or the Qwen3.5 hybrid."""
    if isinstance(cfg, Qwen35Config):
        from ..models.qwen35 import Qwen35Model

        return Qwen35Model
    from ..models.qwen3 import Qwen3Model

    return Qwen3Model


def open_bundle(entry: ModelEntry, device: str | None, dtype: str | None) -> Bundle:
    """Resolve files, config and tokenizer; the weights load later, in load_model()."""
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    target_dir = entry.target.path()
    refuse_drafter(target_dir, entry.target.name)
    cfg = target_config(target_dir)
    tokenizer = ChatTokenizer(target_dir)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise DflashError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {cfg.vocab_size} embeddings")
    return Bundle(entry, target_dir, cfg, tokenizer, dev, dt)


def refuse_drafter(folder: Path, name: str) -> None:
    """A drafter checkpoint given as the model is one clear error (its config names Qwen3 too: it would otherwise
    fail on its tensors or its missing tokenizer)."""
    from .drafters import drafter_kind

    config = folder / "config.json"
    kind = drafter_kind(read_json(config, "model config")) if config.is_file() else None
    if kind:
        raise DflashError(f"{name} is a drafter ({kind}), not a model to run: give it as --draft {name}, with its "
                          f"target as --model")
