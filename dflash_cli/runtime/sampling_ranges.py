"""The ranges of the sampling parameters, without torch: the CLI checks its flags with them before the heavy imports,
and SamplingParams every value it is given."""

from __future__ import annotations

import math

from ..errors import DflashError

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes; beyond, it raises an OverflowError
TOP_K_MAX = 2**63 - 1  # the sampler keeps top-k in an int64 tensor (any value above the vocabulary means all of it)


def invalid(temperature: float | None, top_p: float | None, top_k: int | None,
            seed: int | None = None) -> tuple[str, str] | None:
    """The first value out of range as (its name, what it must be), or None (None values: not set, not checked)."""
    if temperature is not None and not (temperature >= 0 and math.isfinite(temperature)):  # nan passes `< 0`
        return "temperature", f"must be a finite number >= 0 (got {temperature})"
    if top_p is not None and not 0 < top_p <= 1:
        return "top_p", f"must be in (0, 1] (got {top_p})"
    if top_k is not None and not 0 <= top_k <= TOP_K_MAX:
        return "top_k", f"must be >= 0 (got {top_k})" if top_k < 0 else f"must be at most {TOP_K_MAX} (got {top_k})"
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        return "seed", f"must be between {SEED_MIN} and {SEED_MAX} (got {seed})"
    return None


def check_sampling(temperature: float | None, top_p: float | None, top_k: int | None, seed: int | None = None) -> None:
    """A DflashError naming the flag of the first value out of range (None: not set, nothing to check)."""
    bad = invalid(temperature, top_p, top_k, seed)
    if bad is not None:
        name, rule = bad
        raise DflashError(f"--{name.replace('_', '-')} {rule}")
