"""`dflash models` and `dflash pull`: what the registry offers and getting it onto disk."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .. import hub
from ..registry import Registry, Source


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _status(src: Source) -> str:
    path = src.cached()
    return f"✓ {_size(hub.size_on_disk(path))}" if path else "—"


def list_models(console: Console) -> None:
    reg = Registry.load()
    table = Table(title=f"models ({reg.path})", title_justify="left")
    for col in ("name", "target", "downloaded", "drafters"):
        table.add_column(col)
    for name, e in reg.entries.items():
        drafters = ", ".join(f"{kind}: {src.name} [{_status(src)}]" for kind, src in e.drafters.items()) or "—"
        label = name + (" (default)" if name == reg.default else "")
        table.add_row(label, e.target.name, _status(e.target), drafters)
    console.print(table)


def pull(model: str | None, drafters: bool, console: Console) -> None:
    entry = Registry.load().resolve(model)
    sources = [("target", entry.target)] + ([(k, s) for k, s in entry.drafters.items()] if drafters else [])
    for role, src in sources:
        if src.is_local:
            console.print(f"{role}: {src.ref} is a local folder", style="dim")
            continue
        console.print(f"{role}: {src.ref}")
        path = hub.download(src.ref, src.revision)
        console.print(f"  ✓ {path} ({_size(hub.size_on_disk(path))})", style="green")
