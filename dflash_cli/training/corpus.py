"""Python source that exists on any machine with Python: the standard library (and, optionally,
installed packages), split into train and held-out files by a hash of their relative path."""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..errors import DflashError

MAX_FILE_BYTES = 200_000  # generated tables and vendored blobs teach little
SEPARATOR = "<|endoftext|>"


def default_roots() -> list[Path]:
    return [Path(sysconfig.get_paths()["stdlib"])]


@dataclass
class Corpus:
    train: list[str]
    held_out: list[str]
    files: int
    bytes: int
    digest: str  # over the relative paths and contents, to name the data a demo was trained on


def _is_held_out(rel: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def collect(roots: list[Path], max_bytes: int, held_out_fraction: float = 0.02) -> Corpus:
    """Read *.py files under `roots` in sorted order until `max_bytes` of text."""
    paths = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise DflashError(f"training data folder not found: {root}")
        paths.extend((root, p) for p in sorted(root.rglob("*.py")) if "site-packages" not in p.relative_to(root).parts
                     or root.name == "site-packages")
    train, held, total = [], [], 0
    digest = hashlib.sha256()
    for root, path in paths:
        try:
            if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text.strip() or SEPARATOR in text:
            continue
        rel = f"{root.name}/{path.relative_to(root).as_posix()}"
        digest.update(rel.encode())
        digest.update(text.encode())
        (held if _is_held_out(rel, held_out_fraction) else train).append(text)
        total += len(text.encode())
        if total >= max_bytes:
            break
    if not held and len(train) > 1:  # a small corpus: hold out its last file
        held.append(train.pop())
    if not train or not held:
        raise DflashError(f"too little Python source under {', '.join(map(str, roots))} to train on: it takes two "
                          f"files or more (those over {MAX_FILE_BYTES // 1000} KB, empty or not UTF-8 are skipped)")
    return Corpus(train, held, len(train) + len(held), total, digest.hexdigest()[:16])
