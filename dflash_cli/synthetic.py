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
from .loading.config import Qwen3Config
from .models.qwen3 import Qwen3Model, checkpoint_shapes

CONFIG_DIR = Path(__file__).with_name("synthetic_configs")


def shipped_configs(name: str) -> dict:
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
        raise DflashError(f"no synthetic shapes for '{name}' (have: {have})")
    return json.loads(path.read_text())


def qwen3_config(name: str, **over) -> Qwen3Config:
    raw = dict(shipped_configs(name)["target"], **over)
    return Qwen3Config.from_dict(raw, path=f"<synthetic {name}>")


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


def random_qwen3(name: str, device, dtype, seed: int = 0, **over) -> Qwen3Model:
    cfg = qwen3_config(name, **over)
    return Qwen3Model(cfg, random_tensors(checkpoint_shapes(cfg), device, dtype, seed), device, dtype)


def random_drafter(name: str, kind: str, target, seed: int = 1):
    """A random drafter of `kind` with the shapes of the entry's published drafter."""
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
