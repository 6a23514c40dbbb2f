"""`dflash bench`: check the input, run the modes, then show and save the figures."""

from __future__ import annotations

import math

from rich.console import Console

from ..bench.report import check_plot_format, print_table, write_json, write_plot
from ..bench.run import BenchOptions, run_modes
from ..errors import DflashError, Interrupted
from .common import check_writable, set_threads, warn

__all__ = ["BenchOptions", "run_bench", "synthetic_memory"]


def synthetic_memory(o: BenchOptions) -> tuple[float, str, str]:
    """(bytes, device, dtype) the random target weights of --synthetic take (drafters come on top)."""
    import torch

    from ..runtime.bundle import pick_device, pick_dtype
    from ..registry import Registry
    from ..synthetic import target_config, target_shapes

    entry = Registry.load().resolve(o.model)
    device = pick_device(o.device)
    dtype = pick_dtype(o.dtype, device)
    cfg = target_config(entry.name)
    params = sum(math.prod(s) for s in target_shapes(cfg).values())
    return params * torch.empty((), dtype=dtype).element_size(), device.type, str(dtype).replace("torch.", "")


def _available_memory() -> int | None:
    try:
        for line in open("/proc/meminfo", encoding="ascii"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_bench(o: BenchOptions, console: Console) -> dict:
    if o.synthetic_tau is not None and not o.synthetic:
        raise DflashError("--synthetic-tau needs --synthetic")
    if o.synthetic_tau is not None and o.synthetic_tau < 1:
        raise DflashError(f"--synthetic-tau is a mean committed length, >= 1 (got {o.synthetic_tau})")
    if o.synthetic_prompt_len is not None and not o.synthetic:
        raise DflashError("--synthetic-prompt-len needs --synthetic (real prompts come from --prompts)")
    if o.synthetic_prompt_len is not None and o.synthetic_prompt_len < 1:
        raise DflashError(f"--synthetic-prompt-len must be >= 1 (got {o.synthetic_prompt_len})")
    if o.max_tokens < 1 or o.repeat < 1:
        raise DflashError("--max-tokens and --repeat must be >= 1")
    if o.draft_len is not None and o.draft_len < 1:
        raise DflashError(f"--draft-len must be >= 1 (got {o.draft_len})")
    if o.draft_len is not None and o.drafts == ["none"]:
        from ..runtime.decoders import draft_len_ignored

        warn(draft_len_ignored(o.draft_len))
    # Output paths before the run, not after minutes of it.
    check_writable(o.json, "--json")
    check_writable(o.plot, "--plot")
    if o.plot:
        check_plot_format(o.plot)
    if o.synthetic:
        need, device, dtype = synthetic_memory(o)
        line = f"--synthetic: random {dtype} weights of the target need {need / 1e9:.1f} GB of {device} memory (drafters on top)"
        have = _available_memory() if device == "cpu" else None
        if have is not None and need > have:
            raise DflashError(f"{line}; only {have / 1e9:.1f} GB is available")
        console.print(line, style="dim", markup=False, highlight=False)
    threads = set_threads(o.threads, None if o.synthetic else _target_folder(o), _device(o))
    with console.status("loading…" if not o.synthetic else "building random weights…") as status:
        rep = run_modes(o, on_progress=lambda mode, i, n: status.update(f"{mode}: {i}/{n}"))
    if threads:
        rep["threads"] = threads
    if o.json:  # the files first: a reader of the table that stops early (| head) does not cost them
        write_json(rep, o.json)
    if o.plot:
        write_plot(rep, o.plot)
    print_table(rep, console)
    stopped = rep["interrupted"]
    if stopped:
        raise Interrupted(f"interrupted during {stopped['mode']} ({stopped['timed_runs_done']} of "
                          f"{stopped['timed_runs']} timed runs done): the figures are the modes that finished")
    return rep


def _device(o: BenchOptions):
    from ..runtime.bundle import pick_device

    return pick_device(o.device)


def _target_folder(o: BenchOptions):
    from ..registry import Registry

    try:
        return Registry.load().resolve(o.model).target.cached()
    except DflashError:
        return None
