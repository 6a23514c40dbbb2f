"""`dflash train`: the demo pair from Python source on this machine, with a progress bar per stage."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..options import TrainOptions
from ..errors import DflashError, Interrupted

TRAINING = ("target", "distill", "dflash", "selector", "eagle3")  # the stages a GPU is for


def run_train(o: TrainOptions, console: Console) -> dict:
    from ..runtime.bundle import pick_device
    from ..training import corpus, pipeline, presets
    from ..training.loop import SEED_LIMIT
    from ..training.stop import INTERRUPTED

    preset = presets.get(o.preset)
    if o.time_limit is not None and not o.time_limit >= 0:  # nan passes `< 0`
        raise DflashError(f"--time-limit must be >= 0 seconds (got {o.time_limit})")
    if not -SEED_LIMIT <= o.seed <= SEED_LIMIT:
        raise DflashError(f"--seed must be between {-SEED_LIMIT} and {SEED_LIMIT} (got {o.seed})")
    stages = _stages(o.stages)
    device = pick_device(o.device)
    _check_out(o.out)
    # Before the output folder exists: a typo must not leave a run that blocks the next one.
    missing = [str(r) for r in o.data if not Path(r).is_dir()]
    if missing:
        raise DflashError(f"training data folder not found: {', '.join(missing)}")
    roots = o.data or corpus.default_roots()
    empty = [str(r) for r in roots if next(Path(r).rglob("*.py"), None) is None]
    if empty:
        raise DflashError(f"no Python files (*.py) under {', '.join(empty)}")
    pipeline.check_inputs(o.out, stages)
    pipeline.check_same_run(o.out, preset, o.seed)  # a refused resume first: the demo's CPU estimate takes seconds
    if device.type == "cpu" and preset.name == presets.DEMO.name and set(stages) & set(TRAINING):
        _say(console, _cpu_warning(o, preset, device, stages))
    columns = (TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    t0 = time.perf_counter()
    # Shown from the first step: an error before it is one line, not one after an empty progress display.
    progress = Progress(*columns, console=console, transient=False)
    try:
        tasks = {}

        def report(stage: str, step: int, total: int, metrics: dict) -> None:
            first = stage not in tasks
            if first:
                progress.start()
                tasks[stage] = progress.add_task(stage, total=total, completed=0, loss="")
            shown = "  ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:.3f}" for k, v in metrics.items())
            progress.update(tasks[stage], completed=step, loss=shown)
            # A log file gets a readout too: a stage's first step (how long one takes), then every tenth.
            if not console.is_terminal and (first or step * 10 // total != (step - 1) * 10 // total or step == total):
                _say(progress.console, f"{stage} {step}/{total} {shown} ({time.perf_counter() - t0:.0f} s)")

        info = pipeline.train_demo(o.out, preset, roots, device, o.seed, report,
                                   lambda msg: _say(progress.console, msg), None if o.stages is None else stages,
                                   o.time_limit)
    except KeyboardInterrupt:  # outside a training loop (the data, the block choice, the evaluation): nothing lost
        raise Interrupted(f"interrupted: what finished is kept; resume: {_command(o)}") from None
    finally:
        if progress.live.is_started:  # stopping one never started prints an empty line where stdout is no terminal
            progress.stop()
    made = [str(o.out / d) for d in ("target", "dflash", "dflash2", "eagle3")
            if (o.out / d / "model.safetensors").is_file()]
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


def _stages(flag: str | None) -> tuple[str, ...]:
    from ..training.pipeline import STAGES, check_stages

    return STAGES if flag is None else check_stages(s.strip() for s in flag.split(",") if s.strip())


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DflashError(f"{out} exists and is not a folder")
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise DflashError(f"cannot make the folder {out}: {blocker} is a file")
    package = Path(__file__).resolve().parents[1]
    if out.resolve().is_relative_to(package):  # the embedded demo lives there: a run would overwrite or mix with it
        raise DflashError(f"{out} is inside the dflash package ({package}): train into a folder of your own")


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
