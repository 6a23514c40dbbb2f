"""Typed views of Hugging Face `config.json` files for the models we run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DflashError

SUPPORTED_TARGETS = ("qwen3",)
HYBRID_TARGETS = ("qwen3_5", "qwen3_5_text")  # Qwen3.5: Gated DeltaNet + gated attention (Qwen35Config)


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
        _check_model_type(raw, path, allowed_types)
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


def _check_model_type(raw: dict, path: Path, allowed_types) -> str:
    """The config's model_type, one of `allowed_types` (else a DflashError naming what dflash runs)."""
    model_type = raw.get("model_type")
    if model_type is None:
        raise DflashError(f"{path} has no model_type: not a Hugging Face model config")
    if model_type not in allowed_types:
        raise DflashError(f"unsupported model_type '{model_type}' in {path}: dflash runs {', '.join(allowed_types)}")
    return model_type


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


@dataclass(frozen=True)
class Qwen35Config(Qwen3Config):
    """Qwen3.5's text tower (`qwen3_5`'s `text_config`, or a flat `qwen3_5_text` config): Qwen3's fields for the
    full-attention layers plus the Gated DeltaNet's, and which layer is which."""

    layer_types: tuple[str, ...] = ()  # "linear_attention" (Gated DeltaNet) or "full_attention" per layer
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 0.25  # RoPE on the first head_dim * factor dims of q and k

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @classmethod
    def from_dict(cls, raw: dict, path: Path, allowed_types=HYBRID_TARGETS) -> "Qwen35Config":
        model_type = _check_model_type(raw, path, allowed_types)
        text = raw.get("text_config") if model_type == "qwen3_5" else raw
        if not isinstance(text, dict):
            raise DflashError(f"config {path} lacks its text_config")
        # The multimodal checkpoint's head is tied by the outer config's flag (transformers' _tied_weights_keys).
        tied = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        base = Qwen3Config.from_dict(dict(text, model_type="qwen3", tie_word_embeddings=tied,
                                          attention_bias=text.get("attention_bias", False)), path)
        if text.get("hidden_act", "silu") != "silu":
            raise DflashError(f"unsupported hidden_act '{text['hidden_act']}' in {path}: Qwen3.5 uses silu")
        if not text.get("attn_output_gate", True):
            raise DflashError(f"attention without its output gate is not supported ({path})")
        if text.get("num_experts"):
            raise DflashError(f"mixture-of-experts Qwen3.5 models are not supported ({path})")
        layers = base.num_hidden_layers
        types = text.get("layer_types")
        if types is None:
            every = int(text.get("full_attention_interval", 4))
            types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
        types = tuple(types)
        if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
            raise DflashError(f"config {path}: layer_types must name {layers} layers, each linear_attention or "
                              f"full_attention")
        rope = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
        factor = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        cfg = cls(**dict(fields, extra=raw), layer_types=types,
                  linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
                  linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
                  linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
                  linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
                  linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
                  partial_rotary_factor=factor)
        if cfg.linear_num_value_heads % cfg.linear_num_key_heads or cfg.rotary_dim % 2 or cfg.rotary_dim < 2:
            raise DflashError(f"config {path}: value heads must be a multiple of key heads, and the rotary dims even")
        return cfg

    @classmethod
    def load(cls, model_dir: Path) -> "Qwen35Config":
        path = Path(model_dir) / "config.json"
        return cls.from_dict(read_json(path, "model config"), path)


def target_config(model_dir: Path) -> Qwen3Config:
    """The typed config of a target checkpoint, by its model_type: Qwen3 or a Qwen3.5 hybrid."""
    path = Path(model_dir) / "config.json"
    raw = read_json(path, "model config")
    if raw.get("model_type") in HYBRID_TARGETS:
        return Qwen35Config.from_dict(raw, path)
    return Qwen3Config.from_dict(raw, path, allowed_types=SUPPORTED_TARGETS + HYBRID_TARGETS)
