"""`dflash models` and `dflash pull`: what the registry offers and getting it onto disk."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import hub
from ..errors import DflashError, Interrupted
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
    """On a terminal, one block per entry: its name and description, then its target and drafters with what is
    downloaded (long repo ids wrap, never cut). Elsewhere (a pipe, a file), one tab-separated line per entry."""
    reg = Registry.load()
    entries = {name + (" (default)" if name == reg.default else ""): e for name, e in reg.entries.items()}
    if not console.is_terminal:
        lines = [f"# registry {reg.path}", "\t".join(("name", "description", "target", "downloaded", "drafters"))]
        for label, e in entries.items():
            drafters = ", ".join(f"{kind}: {src.name} [{_status(src)}]" for kind, src in e.drafters.items()) or "—"
            lines.append("\t".join((label, e.description or "—", e.target.name, _status(e.target), drafters)))
        console.file.write("\n".join(lines) + "\n")  # as is: rich would turn the tabs into spaces
        return
    rows = {label: [(role, src.name, _status(src)) for role, src in [("target", e.target), *e.drafters.items()]]
            for label, e in entries.items()}
    # The same columns in every block; a repo id wider than the terminal leaves folds onto the next line.
    role_w = 2 + max(len(r[0]) for block in rows.values() for r in block)
    status_w = max(len(r[2]) for block in rows.values() for r in block)
    ref_w = max(8, min(max(len(r[1]) for block in rows.values() for r in block), console.width - role_w - status_w - 4))
    console.print(f"models in {reg.path} (✓ downloaded; — not yet: dflash pull NAME)", style="dim", markup=False)
    for label, e in entries.items():
        head = Text()
        head.append(label, style="bold")
        if e.description:
            head.append(f"  {e.description}", style="dim")
        console.print(head)
        grid = Table.grid(padding=(0, 2))
        grid.add_column(width=role_w)
        grid.add_column(width=ref_w, overflow="fold")
        grid.add_column(width=status_w, overflow="fold")
        for role, ref, status in rows[label]:
            grid.add_row(f"  {role}", ref, status)
        console.print(grid)


def pull(model: str | None, drafters: bool, console: Console) -> None:
    """Each checkpoint in turn: a drafter that fails (a repo gone or gated) does not keep the others from downloading;
    offline, what is already downloaded is done. Ctrl-C keeps what was downloaded, and the same command resumes."""
    entry = Registry.load().resolve(model)
    sources = [("target", entry.target)] + ([(k, s) for k, s in entry.drafters.items()] if drafters else [])
    failed = []
    again = "`" + " ".join(["dflash pull", *([model] if model else []), *([] if drafters else ["--no-drafters"])]) + "`"
    try:
        for role, src in sources:
            if src.is_local:
                console.print(f"{role}: {src.ref} is a local folder", style="dim", soft_wrap=True)
                continue
            console.print(f"{role}: {src.ref}", soft_wrap=True)
            try:
                path = (hub.offline() and src.cached()) or hub.download(src.ref, src.revision, again=again)
            except DflashError as exc:
                if role == "target":
                    raise
                console.print(f"  ✗ {exc}", style="red", soft_wrap=True)
                failed.append(f"{role} ({src.ref})")
                continue
            # soft_wrap: a path is never broken across lines (piped output is 80 columns wide)
            console.print(f"  ✓ {path} ({_size(hub.size_on_disk(path))})", style="green", soft_wrap=True)
    except KeyboardInterrupt:
        raise Interrupted(hub.interrupted(again)) from None
    if failed:
        raise DflashError(f"could not download {', '.join(failed)} (see above); the rest is downloaded")
