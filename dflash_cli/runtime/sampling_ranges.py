"""The ranges of the sampling parameters, without torch: the CLI checks its flags with them before the heavy imports,
and SamplingParams every value it is given."""

from __future__ import annotations

import math

from ..errors import DflashError


def check_sampling(temperature: float | None, top_p: float | None, top_k: int | None) -> None:
    """A DflashError naming the flag of the first value out of range (None: not set, nothing to check)."""
    if temperature is not None and not (temperature >= 0 and math.isfinite(temperature)):  # nan passes `< 0`
        raise DflashError(f"--temperature must be a finite number >= 0 (got {temperature})")
    if top_p is not None and not 0 < top_p <= 1:
        raise DflashError(f"--top-p must be in (0, 1] (got {top_p})")
    if top_k is not None and top_k < 0:
        raise DflashError(f"--top-k must be >= 0 (got {top_k})")
