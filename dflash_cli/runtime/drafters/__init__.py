"""Every drafter kind: how to tell it from a checkpoint's config.json and how to load it (its network from models/,
its runtime from this folder). A new kind adds its two files, its line in KINDS and how detect_kind tells it."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from ...errors import DflashError
from ...loading.config import read_json
from ...models.dflash import is_dflash2


# kind -> (module, network class in models/, runtime class in this folder), imported on first use.
KINDS = {
    "dflash": ("dflash", "DFlashDrafter", "DFlashProposer"),
    "dflash2": ("dflash2", "DFlash2Drafter", "DFlash2Proposer"),
    "eagle3": ("eagle3", "Eagle3Drafter", "Eagle3Proposer"),
    "mtp": ("mtp", "MtpDrafter", "MtpProposer"),  # loaded from the target's own folder (its mtp.* tensors)
}


def proposer(kind: str, drafter):
    """The runtime of a drafter network of `kind` (a loaded checkpoint's, or --synthetic's random one)."""
    module, _, runtime = KINDS[kind]
    return getattr(import_module(f".{module}", __name__), runtime)(drafter)


def load(kind: str, path: Path, target):
    """The drafter checkpoint of `kind` in `path` for `target`: its network and runtime. A DFlash 2 checkpoint loads
    as DFlash where its convolutions are the identity: its block drafter alone (models/dflash2.load_block_drafter;
    the demo's), else that function's error."""
    module, network, _ = KINDS[kind]
    if kind == "dflash" and drafter_kind(read_json(Path(path) / "config.json", "drafter config")) == "dflash2":
        from ...models.dflash2 import load_block_drafter

        return proposer(kind, load_block_drafter(path, target))
    return proposer(kind, getattr(import_module(f"...models.{module}", __name__), network).load(path, target))


def drafter_kind(raw: dict) -> str | None:
    """A drafter's kind from its config.json's contents; None for anything else (a target model's)."""
    arch = " ".join(raw.get("architectures") or []).lower()
    if is_dflash2(raw) or raw.get("speculators_model_type") == "dflash2":  # z-lab's layout or speculators'
        return "dflash2"
    if "dflash" in arch or "dflash_config" in raw:
        return "dflash"
    if "eagle" in arch or "eagle_config" in raw or "draft_vocab_size" in raw:
        return "eagle3"
    return None


def detect_kind(path: Path, asked: str | None = None) -> str:
    """Tell a drafter's kind from its config.json. asked "dflash" of a DFlash 2 checkpoint: "dflash", its block
    drafter alone (`load` checks that its convolutions are the identity)."""
    raw = read_json(path / "config.json", "drafter config")
    if kind := drafter_kind(raw):
        return "dflash" if asked == "dflash" and kind == "dflash2" else kind
    arch = " ".join(raw.get("architectures") or []).lower()
    raise DflashError(f"{path} does not look like a DFlash, DFlash 2 or EAGLE-3 drafter (architectures: {arch or 'none'})")
