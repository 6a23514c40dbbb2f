"""Presenting bench figures: a Rich table, the JSON file and an optional plot."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import DflashError
from ..ui.stream import histogram


def print_table(rep: dict, console: Console) -> None:
    label = " (SYNTHETIC: random weights" + (f", forced τ={rep['synthetic_tau']}" if rep["synthetic_tau"] else "") + ")" \
        if rep["synthetic"] else ""
    table = Table(title=f"dflash bench · {rep['model']}{label} · {rep['device']} · {rep['dtype']} · "
                        f"{len(rep['prompts'])} prompts × {rep['repeat']} · {rep['max_tokens']} max tokens · "
                        + (f"T {rep['temperature']:g}, top-p {rep['top_p']:g}, top-k {rep['top_k']}"
                           if rep["temperature"] > 0 else "greedy"),
                  title_justify="left")
    for col in ("mode", "tok/s", "speedup", "TTFT ms", "τ", "accepted hist", "draft ms/step", "verify ms/step",
                "step ms"):
        table.add_column(col, justify="left" if col in ("mode", "accepted hist") else "right")
    for m in rep["modes"]:
        spec = m["draft_kind"] != "none"
        table.add_row(
            m["mode"],
            f"{m['decode_tok_per_s']:.1f}",
            f"{m['speedup']:.2f}×" if m["speedup"] else "—",
            f"{m['ttft_s'] * 1000:.1f}",
            f"{m['tau']:.2f}" if spec else "1.00",
            histogram(m["accepted_drafts_hist"]) if spec else "",
            f"{m['draft_ms_per_step']:.2f}" if spec else "—",
            f"{m['verify_ms_per_step']:.2f}",
            f"{m['step_ms']:.2f}",
        )
    console.print(table)
    eng = rep.get("engine")
    if eng:
        line = f"engine: {eng['path']}"
        if eng["graph_captures"]:
            line += (f" · {eng['graph_captures']} CUDA graphs (target and drafters) captured in "
                     f"{eng['graph_capture_s']:.2f} s, {eng.get('graph_captures_timed', 0)} during timed runs")
        console.print(line)


def write_json(rep: dict, path: Path) -> None:
    try:
        Path(path).expanduser().write_text(json.dumps(rep, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise DflashError(f"cannot write {path}: {exc.strerror}") from None


def require_matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DflashError("--plot needs matplotlib: pip install 'dflash-cli[plot]' (or matplotlib)") from None
    return plt


def check_plot_format(path: Path) -> None:
    """--plot's file type, before the run (matplotlib picks the format by the suffix): one it can write."""
    plt = require_matplotlib()
    suffix = Path(path).suffix.lstrip(".").lower()
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if suffix and suffix not in formats:  # no suffix: matplotlib writes a PNG
        raise DflashError(f"--plot {path}: matplotlib cannot write .{suffix} files (use .png, .svg or .pdf)")


def write_plot(rep: dict, path: Path) -> None:
    plt = require_matplotlib()
    modes = rep["modes"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar([m["mode"] for m in modes], [m["decode_tok_per_s"] for m in modes], color="tab:blue")
    axes[0].set_ylabel("decode tok/s")
    axes[0].set_title(f"{rep['model']} on {rep['device']}" + (" (synthetic)" if rep["synthetic"] else ""))
    for m in modes:
        if m["draft_kind"] != "none" and m["accepted_drafts_hist"]:
            total = sum(m["accepted_drafts_hist"]) or 1
            axes[1].plot(range(len(m["accepted_drafts_hist"])), [c / total for c in m["accepted_drafts_hist"]], marker="o", label=m["mode"])
    axes[1].set_xlabel("accepted drafts per step")
    axes[1].set_ylabel("fraction of steps")
    axes[1].legend() if axes[1].lines else axes[1].text(0.5, 0.5, "no drafter", ha="center")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise DflashError(f"cannot write {path}: {exc.strerror}") from None
