"""Every drafter kind: how to tell it from a checkpoint's config.json and how to load it (its network from models/,
its runtime from this folder). A new kind adds its two files and one line to LOADERS."""

from __future__ import annotations

from pathlib import Path

from ...errors import DflashError
from ...loading.config import read_json
from ...models.dflash import is_dflash2


def _dflash(path: Path, target):
    from ... import tuning
    from ...models.dflash import DFlashDrafter
    from .dflash import DFlashProposer

    return DFlashProposer(DFlashDrafter.load(path, target, window=tuning.KNOBS.draft_window))


def _dflash2(path: Path, target):
    from ...models.dflash2 import DFlash2Drafter
    from .dflash2 import DFlash2Proposer

    return DFlash2Proposer(DFlash2Drafter.load(path, target))


def _eagle3(path: Path, target):
    from ...models.eagle3 import Eagle3Drafter
    from .eagle3 import Eagle3Proposer

    return Eagle3Proposer(Eagle3Drafter.load(path, target))


def _mtp(path: Path, target):
    from ...models.mtp import MtpDrafter
    from .mtp import MtpProposer

    return MtpProposer(MtpDrafter.load(path, target))


LOADERS = {"dflash": _dflash, "dflash2": _dflash2, "eagle3": _eagle3, "mtp": _mtp}


def detect_kind(path: Path) -> str:
    """Tell a drafter's kind from its config.json."""
    raw = read_json(path / "config.json", "drafter config")
    arch = " ".join(raw.get("architectures") or []).lower()
    if is_dflash2(raw) or raw.get("speculators_model_type") == "dflash2":  # z-lab's layout or speculators'
        return "dflash2"
    if "dflash" in arch or "dflash_config" in raw:
        return "dflash"
    if "eagle" in arch or "eagle_config" in raw or "draft_vocab_size" in raw:
        return "eagle3"
    raise DflashError(f"{path} does not look like a DFlash, DFlash 2 or EAGLE-3 drafter (architectures: {arch or 'none'})")
