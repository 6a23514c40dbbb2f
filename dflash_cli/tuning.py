"""The knobs: every setting a user or a benchmark may change, in one frozen object read from the environment once a
command (`configure`, which the CLI calls first; `KNOBS` holds the current one). Constants that are not knobs live
beside the code they shape, with one line of why; the measurements behind them are in docs/TUNING.md."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .errors import DflashError

GEMMS = ("auto", "cublas", "triton")


@dataclass(frozen=True)
class Tuning:
    graphs: bool = True  # DFLASH_GRAPHS: replay every short forward from a CUDA graph (0: run them eagerly)
    kernels: bool = True  # DFLASH_KERNELS: our Triton and CUDA kernels on the GPU (0: torch's own ops)
    gemm: str = "auto"  # DFLASH_GEMM: few-row products on our CUDA GEMM where it builds (auto), cuBLAS, or Triton's
    pdl: bool = True  # DFLASH_PDL: early launches on Hopper (each kernel starts while the one before it drains)
    queue_ahead: bool = True  # DFLASH_QUEUE_AHEAD: queue a step's successor before the host reads the step's outcome
    selector: bool = True  # DFLASH_SELECTOR: DFlash 2's candidate selector (0: each draft row's argmax)
    block_trace: bool = False  # DFLASH_BLOCK_TRACE: per-block timestamps built into the kernels (benchmarks/)
    kernel_cache: Path = Path.home() / ".cache" / "dflash" / "kernels"  # DFLASH_KERNEL_CACHE: built kernels
    registry: Path | None = None  # DFLASH_REGISTRY: a models.toml of one's own instead of the packaged one
    debug: bool = False  # DFLASH_DEBUG: a traceback instead of the one error line
    # DFLASH_FORCE_TAU (benchmarks only): a speculative `generate` commits this many tokens a step on average, the
    # target's own greedy continuation forced into its drafts (bench/forced.py): the product path at a chosen τ.
    force_tau: float | None = None
    # DFLASH_DRAFT_WINDOW: a sliding window (keys) for every DFlash drafter layer that has none (all of a Qwen3
    # drafter's): bounds the drafter's attention on long prompts; the drafter was not trained with it, so acceptance
    # can drop (docs/dflash-sliding-window.md)
    draft_window: int | None = None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw not in ("0", "1"):
        raise DflashError(f"{name}={raw!r}: must be 0 or 1")
    return raw == "1"


def read(env: Mapping[str, str] = os.environ) -> Tuning:
    """The knobs the environment sets (DFLASH_*), the rest at their defaults; a bad value is a one-line DflashError."""
    gemm = env.get("DFLASH_GEMM") or "auto"
    if gemm not in GEMMS:
        raise DflashError(f"DFLASH_GEMM={gemm!r}: must be one of {', '.join(GEMMS)}")
    cache, registry = env.get("DFLASH_KERNEL_CACHE"), env.get("DFLASH_REGISTRY")
    force_tau = _tau(env.get("DFLASH_FORCE_TAU"))
    window = env.get("DFLASH_DRAFT_WINDOW") or None
    if window is not None and not (window.isdigit() and int(window) > 0):
        raise DflashError(f"DFLASH_DRAFT_WINDOW={window!r}: must be a positive number of keys")
    return Tuning(graphs=_flag(env, "DFLASH_GRAPHS", True), kernels=_flag(env, "DFLASH_KERNELS", True), gemm=gemm,
                  pdl=_flag(env, "DFLASH_PDL", True), queue_ahead=_flag(env, "DFLASH_QUEUE_AHEAD", True),
                  selector=_flag(env, "DFLASH_SELECTOR", True),
                  block_trace=_flag(env, "DFLASH_BLOCK_TRACE", False),
                  kernel_cache=Path(cache) if cache else Tuning.kernel_cache,
                  registry=Path(registry) if registry else None, debug=bool(env.get("DFLASH_DEBUG")),
                  force_tau=force_tau, draft_window=int(window) if window else None)


def _tau(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        tau = float(raw)
    except ValueError:
        tau = 0.0
    if not 1.0 <= tau < float("inf"):
        raise DflashError(f"DFLASH_FORCE_TAU={raw!r}: must be a number >= 1 (tokens committed per step)")
    return tau


try:
    KNOBS = read()
except DflashError:  # reported by configure(), which the CLI runs first
    KNOBS = Tuning()


def configure(env: Mapping[str, str] = os.environ) -> Tuning:
    """Read the knobs for this command (raises a DflashError on a bad value)."""
    global KNOBS
    KNOBS = read(env)
    return KNOBS
