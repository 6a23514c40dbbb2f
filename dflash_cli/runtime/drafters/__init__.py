"""From a --draft value to a step decoder: none, a registry kind, or a drafter folder / Hub repo."""

from __future__ import annotations

from pathlib import Path

from ..generation import PlainDecoder
from ..speculative import SpeculativeDecoder
from ...errors import DflashError
from ...loading.config import read_json
from ...registry import DRAFT_KINDS, Source


def _dflash(path: Path, target):
    from .dflash import DFlashProposer
    from ...models.dflash import DFlashDrafter

    return DFlashProposer(DFlashDrafter.load(path, target))


def _eagle3(path: Path, target):
    from .eagle3 import Eagle3Proposer
    from ...models.eagle3 import Eagle3Drafter

    return Eagle3Proposer(Eagle3Drafter.load(path, target))


LOADERS = {"dflash": _dflash, "eagle3": _eagle3}


def detect_kind(path: Path) -> str:
    """Tell a drafter's kind from its config.json."""
    raw = read_json(path / "config.json", "drafter config")
    arch = " ".join(raw.get("architectures") or []).lower()
    if "dflash" in arch or "dflash_config" in raw:
        return "dflash"
    if "eagle" in arch or "eagle_config" in raw or "draft_vocab_size" in raw:
        return "eagle3"
    raise DflashError(f"{path} does not look like a DFlash or EAGLE-3 drafter (architectures: {arch or 'none'})")


def default_draft(entry) -> str:
    return "dflash" if "dflash" in entry.drafters else "none"


def make_decoder(bundle, draft: str | None, draft_len: int | None = None):
    """The decoder for --draft (default: the entry's DFlash drafter, else plain decoding)."""
    draft = draft or default_draft(bundle.entry)
    if draft == "none":
        return PlainDecoder()
    if draft in DRAFT_KINDS:
        src = bundle.entry.drafters.get(draft)
        if src is None:
            raise DflashError(f"model '{bundle.entry.name}' has no {draft} drafter in the registry: "
                              f"pass --draft PATH_OR_REPO, or --draft none")
    else:
        src = Source(draft)
    path = src.path()
    kind = detect_kind(path)
    if draft in DRAFT_KINDS and kind != draft:
        raise DflashError(f"the registry's {draft} drafter {src.ref} is a {kind} checkpoint")
    if draft_len is not None and draft_len < 1:
        raise DflashError(f"--draft-len must be >= 1 (got {draft_len})")
    proposer = LOADERS[kind](path, bundle.load_model())
    if draft_len is None and kind == "eagle3":
        draft_len = bundle.entry.draft_len  # chain length; DFlash's block size is fixed by its checkpoint
    return SpeculativeDecoder(proposer, draft_len)
