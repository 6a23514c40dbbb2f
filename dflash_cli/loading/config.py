"""Typed views of Hugging Face `config.json` files for the models we run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DflashError

SUPPORTED_TARGETS = ("qwen3",)


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise DflashError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DflashError(f"{what} is not valid JSON ({path}): {exc}") from None
    if not isinstance(data, dict):
        raise DflashError(f"{what} must hold a JSON object: {path}")
    return data


def _need(raw: dict, key: str, path: Path):
    if key not in raw:
        raise DflashError(f"config {path} lacks required field '{key}'")
    return raw[key]


@dataclass(frozen=True)
class Qwen3Config:
    """The fields of a Qwen3 dense config that change the computation."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, raw: dict, path: Path, allowed_types=SUPPORTED_TARGETS,
                  sliding: bool = False) -> "Qwen3Config":
        """sliding: the caller reads the sliding-window fields itself (a DFlash drafter's per-layer windows,
        models/dflash.py); otherwise a config with a window is refused."""
        model_type = raw.get("model_type")
        if model_type not in allowed_types:
            raise DflashError(
                f"unsupported model_type '{model_type}' in {path}: dflash runs {', '.join(allowed_types)}"
            )
        _check_rope(raw, path)
        if raw.get("use_sliding_window") and raw.get("sliding_window") and not sliding:
            raise DflashError(f"sliding-window attention is not supported ({path})")
        heads = int(_need(raw, "num_attention_heads", path))
        hidden = int(_need(raw, "hidden_size", path))
        return cls(
            vocab_size=int(_need(raw, "vocab_size", path)),
            hidden_size=hidden,
            intermediate_size=int(_need(raw, "intermediate_size", path)),
            num_hidden_layers=int(_need(raw, "num_hidden_layers", path)),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(raw)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            extra=raw,
        )

    @classmethod
    def load(cls, model_dir: Path) -> "Qwen3Config":
        path = Path(model_dir) / "config.json"
        return cls.from_dict(read_json(path, "model config"), path)


def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    return raw.get("rope_theta", 10000.0)


def _check_rope(raw: dict, path: Path) -> None:
    # Only plain RoPE is implemented; scaled variants change every position's angle.
    for key in ("rope_scaling", "rope_parameters"):
        spec = raw.get(key)
        if not spec:
            continue
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind != "default":
            raise DflashError(f"unsupported {key} type '{kind}' in {path}: only plain RoPE is implemented")
