"""From a --draft value to a step decoder: none, a registry kind, or a drafter folder / Hub repo."""

from __future__ import annotations

from pathlib import Path

from ..errors import DflashError
from ..registry import DRAFT_KINDS, Source, check_not_a_path, draft_kind, looks_like_repo_id
from .drafters import detect_kind, load as load_drafter
from .generation import PlainDecoder
from .speculative import SpeculativeDecoder


def default_draft(entry) -> str:
    return "dflash" if "dflash" in entry.drafters else "none"


def make_decoder(bundle, draft: str | None, draft_len: int | None = None):
    """The decoder for --draft (default: the entry's DFlash drafter, else plain decoding): none or a kind (in any
    case), else a drafter folder or Hub repo id."""
    draft = draft or default_draft(bundle.entry)
    draft = draft_kind(draft) or draft
    if draft == "none":
        return PlainDecoder()
    if draft_len is not None and draft_len < 1:
        raise DflashError(f"--draft-len must be >= 1 (got {draft_len})")
    if draft == "mtp":  # the target's own multi-token-prediction layer, in the target's folder
        check_mtp(bundle)
        return SpeculativeDecoder(load_drafter("mtp", bundle.target_dir, bundle.load_model()), draft_len)
    if draft in DRAFT_KINDS:
        src = bundle.entry.drafters.get(draft)
        if src is None:
            raise DflashError(f"model '{bundle.entry.name}' has no {draft} drafter in the registry: "
                              f"pass --draft PATH_OR_REPO, or --draft none")
    else:
        if not Path(draft).expanduser().is_dir():
            check_not_a_path(draft, "--draft")
            if not looks_like_repo_id(draft):
                raise DflashError(f"unknown drafter '{draft}': not a kind ({', '.join(('none',) + DRAFT_KINDS)}), "
                                  f"a drafter folder or a Hub repo id (owner/name)")
        src = Source(draft)
    path = src.path()
    kind = detect_kind(path, draft)
    if draft in DRAFT_KINDS and kind != draft:
        raise DflashError(f"the registry's {draft} drafter {src.ref} is a {kind} checkpoint")
    proposer = load_drafter(kind, path, bundle.load_model())
    if draft_len is None and draft == "eagle3":
        draft_len = bundle.entry.draft_len  # the registry's chain length; DFlash's block is fixed by its checkpoint
    return SpeculativeDecoder(proposer, draft_len)


def check_draft_len(decoder, draft_len: int | None, name: str = "--draft-len") -> None:
    """--draft-len above what the drafter can propose is an error naming the maximum (not a silent clamp). name: how
    the caller's user set it (chat's /set: draft_len)."""
    proposer = getattr(decoder, "proposer", None)
    if draft_len is None or proposer is None:
        return
    most = getattr(getattr(proposer, "inner", proposer), "max_draft", None)
    if most is not None and draft_len > most:
        raise DflashError(f"{name} {draft_len} is more than this {decoder.kind} drafter proposes: at most {most}")


def unused_draft_len(decoder, draft_len: int | None) -> str | None:
    """The warning for --draft-len with plain decoding (it drafts nothing), or None."""
    if draft_len is None or getattr(decoder, "proposer", None) is not None:
        return None
    return draft_len_ignored(draft_len)


def draft_len_ignored(draft_len: int) -> str:
    """The warning for a --draft-len that plain decoding alone would get (bench's `--draft none`, before loading)."""
    return f"--draft-len {draft_len} is ignored: plain decoding (--draft none) drafts nothing"


def check_mtp(bundle) -> None:
    """--draft mtp before the target loads: a Qwen3.5 checkpoint that ships its MTP weights."""
    from ..models.mtp import require_mtp

    require_mtp(bundle.cfg, bundle.target_dir, f"'{bundle.entry.name}'")
