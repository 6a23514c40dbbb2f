"""`dflash train`: the demo pair from Python source on this machine, with a progress bar per stage."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..options import TrainOptions
from ..errors import DflashError

TRAINING = ("target", "distill", "dflash", "eagle3")  # the stages a GPU is for


def run_train(o: TrainOptions, console: Console) -> dict:
    from ..runtime.bundle import pick_device
    from ..training import corpus, pipeline, presets
    from ..training.stop import INTERRUPTED

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
    if device.type == "cpu" and preset.name == presets.DEMO.name and set(stages) & set(TRAINING):
        pipeline.check_same_run(o.out, preset, o.seed)  # a refused resume first: the estimate takes seconds
        _say(console, _cpu_warning(o, preset, device, stages))
    columns = (TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    t0 = time.perf_counter()
    with Progress(*columns, console=console, transient=False) as progress:
        tasks = {}

        def report(stage: str, step: int, total: int, metrics: dict) -> None:
            first = stage not in tasks
            if first:
                tasks[stage] = progress.add_task(stage, total=total, completed=0, loss="")
            shown = "  ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            progress.update(tasks[stage], completed=step, loss=shown)
            # A log file gets a readout too: a stage's first step (how long one takes), then every tenth.
            if not console.is_terminal and (first or step * 10 // total != (step - 1) * 10 // total or step == total):
                _say(progress.console, f"{stage} {step}/{total} {shown} ({time.perf_counter() - t0:.0f} s)")

        info = pipeline.train_demo(o.out, preset, roots, device, o.seed, report,
                                   lambda msg: _say(progress.console, msg), stages, o.time_limit)
    made = [str(o.out / d) for d in ("target", "dflash", "eagle3") if (o.out / d / "model.safetensors").is_file()]
    _say(console, f"trained: {', '.join(made) or 'nothing yet (only the tokenizer)'}")
    if info.get("stages"):
        _say(console, "stages: " + ", ".join(f"{k} {v['seconds']:.0f} s on {v['device']}"
                                             + ("" if v.get("finished", True) else " (unfinished)")
                                             for k, v in info["stages"].items()))
    if info.get("paused"):
        pz = info["paused"]
        _say(console, f"paused: {pz['stage']} at {pz['done']}/{pz['total']} ({pz.get('by', 'time limit')}); "
                      f"resume: {_command(o)}")
        if pz.get("by") == "Ctrl-C":
            raise typer.Exit(INTERRUPTED)  # a run Ctrl-C paused exits as any interrupted command, saved or not
    if (o.out / "dflash" / "model.safetensors").is_file():  # the folder is a model whose drafters are found
        _say(console, f"try: dflash generate --model {shlex.quote(str(o.out))} --prompt \"def fibonacci(n):\"")
    return info


def _say(console: Console, text: str) -> None:
    """One line as it is: never wrapped by rich at 80 columns where the output is a pipe or a file (a command broken
    in two does not paste), nor read as markup."""
    console.print(text, soft_wrap=True, markup=False)


def _cpu_warning(o: TrainOptions, preset, device, stages) -> str:
    """The demo preset on a CPU: how long it will take, from a timed step of its target where that stage is to run."""
    from ..training import target as target_stage

    head = f"note: the {preset.name} preset is sized for a GPU"
    tail = "going on; `--preset tiny` trains a small pair in seconds here, or train on a GPU (`--device cuda`)"
    if "target" not in stages or (o.out / "target" / "model.safetensors").is_file():
        return f"{head}: its distillation and drafter stages take days on a CPU; {tail}"
    step = target_stage.step_seconds(preset, device)
    return (f"{head}: on this CPU its target stage alone takes about {_duration(step * preset.target_steps)} "
            f"({preset.target_steps} steps of ~{step:.0f} s, timed now) and the stages after it longer still; {tail}")


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    if hours >= 48:
        return f"{hours / 24:.0f} days"
    return f"{hours:.0f} hours" if hours >= 2 else f"{seconds / 60:.0f} minutes"


def _command(o: TrainOptions) -> str:
    """The `dflash train` command line of these options (those not at their default), to run again."""
    words = ["dflash", "train", str(o.out)]
    defaults = TrainOptions()
    for flag, name in (("--preset", "preset"), ("--device", "device"), ("--seed", "seed"), ("--stages", "stages"),
                       ("--time-limit", "time_limit")):
        value = getattr(o, name)
        if value != getattr(defaults, name):
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    for root in o.data:
        words += ["--data", str(root)]
    return shlex.join(words)
