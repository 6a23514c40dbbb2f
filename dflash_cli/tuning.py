"""Numeric switches read from the environment (A/B runs, tuning): a bad value is a one-line DflashError."""

from __future__ import annotations

import os

from .errors import DflashError


def env_number(name: str, default, kind):
    """A numeric switch from the environment (int or float), or a one-line DflashError naming it."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise DflashError(f"{name}={raw!r}: not {'an integer' if kind is int else 'a number'}") from None


def env_power_of_two(name: str, default: int, low: int, high: int) -> int:
    """An integer switch that must be a power of two in [low, high]."""
    value = env_number(name, default, int)
    if not low <= value <= high or value & (value - 1):
        raise DflashError(f"{name}={value}: must be a power of two from {low} to {high}")
    return value
