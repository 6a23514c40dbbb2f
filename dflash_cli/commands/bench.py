"""`dflash bench`: run the modes, then show and save the figures."""

from __future__ import annotations

from rich.console import Console

from ..bench.report import print_table, require_matplotlib, write_json, write_plot
from ..bench.run import BenchOptions, run_modes
from ..errors import DflashError


def run_bench(o: BenchOptions, console: Console) -> dict:
    if o.synthetic_tau is not None and not o.synthetic:
        raise DflashError("--synthetic-tau needs --synthetic")
    if o.synthetic_tau is not None and o.synthetic_tau < 1:
        raise DflashError(f"--synthetic-tau is a mean committed length, >= 1 (got {o.synthetic_tau})")
    if o.plot:
        require_matplotlib()  # fail before the run, not after it
    with console.status("benchmarking…") as status:
        rep = run_modes(o, on_progress=lambda mode, i, n: status.update(f"{mode}: {i}/{n}"))
    print_table(rep, console)
    if o.json:
        write_json(rep, o.json)
    if o.plot:
        write_plot(rep, o.plot)
    return rep
