"""Random-weight models with the exact shapes of published checkpoints (no download).

Used to measure what the engine costs per step on any GPU; results are labelled synthetic.
The shapes come from `synthetic_configs/NAME.json`: the published config.json fields
of a registry entry's target and drafters.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .errors import DflashError
from .loading.config import HYBRID_TARGETS, Qwen3Config, Qwen35Config

CONFIG_DIR = Path(__file__).with_name("synthetic_configs")


def shipped_configs(name: str) -> dict:
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
        raise DflashError(f"no synthetic shapes for '{name}' (have: {have})")
    return json.loads(path.read_text())


def target_config(name: str, **over) -> Qwen3Config:
    """The entry's target config: Qwen3, or a Qwen3.5 hybrid (Qwen35Config) by its model_type."""
    raw = dict(shipped_configs(name)["target"])
    if raw.get("model_type") in HYBRID_TARGETS:
        raw["text_config"] = dict(raw["text_config"], **over)  # the text tower's fields
        return Qwen35Config.from_dict(raw, path=f"<synthetic {name}>")
    return Qwen3Config.from_dict(dict(raw, **over), path=f"<synthetic {name}>")


def target_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """The target's checkpoint tensors and shapes (its model file's checkpoint_shapes)."""
    if isinstance(cfg, Qwen35Config):
        from .models.qwen35 import checkpoint_shapes
    else:
        from .models.qwen3 import checkpoint_shapes
    return checkpoint_shapes(cfg)


def random_tensors(shapes: dict[str, tuple[int, ...]], device, dtype, seed: int = 0, std: float = 0.02,
                   head_std: float = 0.05) -> dict[str, torch.Tensor]:
    """Normal(0, std) matrices, norms near 1; the head is wider so greedy choices are not all near-ties."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            t = 1.0 + 0.05 * torch.randn(shape, generator=g, device=device)
        else:
            s = head_std if ("lm_head" in name or "embed_tokens" in name) else std
            t = s * torch.randn(shape, generator=g, device=device)
        out[name] = t.to(dtype)
    return out


def random_target(name: str, device, dtype, seed: int = 0, **over):
    """A random-weight target (Qwen3Model or Qwen35Model) with the entry's shapes."""
    from .runtime.bundle import target_class

    cfg = target_config(name, **over)
    return target_class(cfg)(cfg, random_tensors(target_shapes(cfg), device, dtype, seed), device, dtype)


def random_drafter(name: str, kind: str, target, seed: int = 1):
    """A random drafter of `kind` with the shapes of the entry's published drafter (mtp: of the target's own MTP
    layer, which every Qwen3.5 checkpoint ships)."""
    if kind == "mtp":
        from .models.mtp import MtpDrafter, checkpoint_shapes as mtp_shapes

        if not isinstance(target.cfg, Qwen35Config):
            raise DflashError(f"'{name}' is not a Qwen3.5 model: it has no multi-token-prediction layer")
        return MtpDrafter(random_tensors(mtp_shapes(target.cfg), target.device, target.dtype, seed), target)
    raw = shipped_configs(name).get(kind)
    if raw is None:
        raise DflashError(f"no synthetic {kind} drafter shapes for '{name}'")
    where = Path(f"<synthetic {name} {kind}>")
    if kind == "dflash":
        from .models.dflash import DFlashConfig, DFlashDrafter, checkpoint_shapes as shapes

        c = DFlashConfig(raw, where)
        return DFlashDrafter(c, random_tensors(shapes(c), target.device, target.dtype, seed), target, str(where))
    if kind == "dflash2":
        from .models.dflash2 import DFlash2Config, DFlash2Drafter, checkpoint_shapes as shapes2

        c = DFlash2Config(raw, where)
        return DFlash2Drafter(c, random_tensors(shapes2(c), target.device, target.dtype, seed), target, str(where))
    if kind == "eagle3":
        from .models.eagle3 import Eagle3Config, Eagle3Drafter

        c = Eagle3Config(raw, where, target.cfg)
        tensors = random_tensors(c.checkpoint_shapes(), target.device, target.dtype, seed)
        tensors.update(c.identity_maps(target.device))
        return Eagle3Drafter(c, tensors, target, str(where))
    raise DflashError(f"unknown drafter kind '{kind}'")
