"""Programmatic dependent launch (Hopper and newer) for the kernels of a step.

A kernel launched this way may start while the previous one drains: every kernel
first lets the next one launch, then waits for the previous one to finish (its
writes are then visible) before it reads or writes anything another kernel owns.
Only what no kernel of the step writes is read before the wait: weights (the skinny
GEMM prefetches them) and, in a long decode split, cached keys of earlier steps
(attention.EARLY_KEYS), which such a kernel reads between `trigger` and `wait`
instead of calling `start`. In a CUDA graph the chain of a whole step overlaps each
kernel's ramp-up with its predecessor's tail. The `pdl` knob (tuning.py) turns it off.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import tuning

_hopper: dict = {}


def hopper(device: torch.device) -> bool:
    """Whether compiled kernels run on an NVIDIA GPU of compute capability 9.0 or newer (programmatic dependent
    launch, bulk L2 prefetches): not on a CPU, in Triton's interpreter or on ROCm."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or torch.version.hip is not None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _hopper:
        _hopper[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _hopper[index]


def enabled(device: torch.device) -> bool:
    return tuning.KNOBS.pdl and hopper(device)


def launch_options(device: torch.device, allowed: bool = True, trigger: bool = False) -> dict:
    """Keyword arguments for a Triton launch: the kernel's PDL flag and Triton's launch option.
    trigger: where the launch itself is not allowed to overlap its predecessor, the kernel still lets the next
    one launch early (its wait is then a no-op): the next kernel's weight prefetch overlaps this one."""
    on = device.type == "cuda" and enabled(device)
    if on and allowed:
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": on and trigger}


@triton.jit
def start(PDL: tl.constexpr):
    """First statement of every kernel of the step (see the module's docstring): `trigger`, then `wait`."""
    trigger(PDL)
    wait(PDL)


@triton.jit
def trigger(PDL: tl.constexpr):
    """Let the next kernel launch."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """Wait for the previous kernel to finish (its writes then visible)."""
    if PDL:
        gdc_wait()
