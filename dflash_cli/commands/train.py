"""`dflash train`: the demo pair from Python source on this machine, with a progress bar per stage."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..options import TrainOptions
from ..errors import DflashError


def run_train(o: TrainOptions, console: Console) -> dict:
    from ..runtime.bundle import pick_device
    from ..training import corpus, pipeline, presets

    preset = presets.get(o.preset)
    if o.time_limit is not None and o.time_limit < 0:
        raise DflashError(f"--time-limit must be >= 0 seconds (got {o.time_limit})")
    device = pick_device(o.device)
    stages = tuple(s.strip() for s in o.stages.split(",")) if o.stages else pipeline.STAGES
    if o.out.exists() and not o.out.is_dir():
        raise DflashError(f"{o.out} exists and is not a folder")
    missing = [str(r) for r in o.data if not Path(r).is_dir()]
    if missing:  # before the output folder exists: a typo must not leave a run that blocks the next one
        raise DflashError(f"training data folder not found: {', '.join(missing)}")
    roots = o.data or corpus.default_roots()
    columns = (TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    t0 = time.perf_counter()
    with Progress(*columns, console=console, transient=False) as progress:
        tasks = {}

        def report(stage: str, step: int, total: int, metrics: dict) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total, completed=0, loss="")
            shown = "  ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            progress.update(tasks[stage], completed=step, loss=shown)
            if not console.is_terminal and (step * 10 // total != (step - 1) * 10 // total or step == total):
                progress.console.print(f"{stage} {step}/{total} {shown} ({time.perf_counter() - t0:.0f} s)")  # a log file gets a readout too

        info = pipeline.train_demo(o.out, preset, roots, device, o.seed, report, progress.console.print, stages,
                                   o.time_limit)
    made = [str(o.out / d) for d in ("target", "dflash", "eagle3") if (o.out / d / "model.safetensors").is_file()]
    console.print(f"trained: {', '.join(made) or 'nothing yet (only the tokenizer)'}")
    if info.get("stages"):
        console.print("stages: " + ", ".join(f"{k} {v['seconds']:.0f} s on {v['device']}"
                                             + ("" if v.get("finished", True) else " (unfinished)")
                                             for k, v in info["stages"].items()))
    if info.get("paused"):
        pz = info["paused"]
        console.print(f"paused: {pz['stage']} at {pz['done']}/{pz['total']} (--time-limit); rerun to resume")
    if (o.out / "dflash" / "model.safetensors").is_file():
        console.print(f"try: dflash generate --model {o.out}/target --draft {o.out}/dflash --prompt \"def fibonacci(n):\"")
    return info
