"""One preferred L1 / shared-memory split for every kernel of a captured step.

Each kernel otherwise gets the driver's own choice: the products (a few KB of shared memory a block) the largest
L1, an attention split of 70-112 KB the largest shared part. An SM changes its split only once it has drained,
and under programmatic dependent launch it never drains, so the kernels after such a split ran with its small L1,
and a kernel launched early could only land on the SMs that had drained. With one preference for all (CARVEOUT
percent of the most shared memory an SM has: 43 is 100 KB, leaving 156 KB of L1), the attention can launch early
(kernels/attention.py, LONG_CHAIN). H100 graph replays (benchmarks/2026-11-25-h100/session36/): the preference
alone leaves the decode step as it was (3.108 against 3.111-3.115 ms); 28 (64 KB) was slower everywhere, 57 (132 KB)
slower for the 16-row verify. DFLASH_CARVEOUT=-1: the driver's choice, as before.
`apply` sets it on every kernel compiled so far; graphs call it after their warm-up, before the capture.
"""

from __future__ import annotations

import ctypes

from ..errors import DflashError
from ..tuning import env_number


def percentage(value: int) -> int:
    """value as a carveout preference: 0 to 100, or -1 (the driver's choice); else a one-line DflashError."""
    if not -1 <= value <= 100:
        raise DflashError(f"DFLASH_CARVEOUT={value}: must be a percentage from 0 to 100, or -1 (the driver's choice)")
    return value


CARVEOUT = percentage(env_number("DFLASH_CARVEOUT", 43, int))
_PREFERRED = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
_done: set[int] = set()


def compiled(modules) -> list:
    """(name, compiled kernel) of every Triton kernel of `modules` compiled so far."""
    import triton

    return [(name, kernel) for mod in modules for name, fn in vars(mod).items()
            if isinstance(fn, triton.runtime.jit.JITFunction)
            for caches in getattr(fn, "device_caches", {}).values() for kernel in caches[0].values()]


def _handles():
    """The function handles of every Triton kernel and csrc/ cubin function of the step loaded so far."""
    from . import attention, cubin, elementwise, greedy, prefill_attention, skinny_gemm

    for _, kernel in compiled((attention, elementwise, greedy, prefill_attention, skinny_gemm)):
        if getattr(kernel, "function", None):
            yield int(kernel.function)
    for module in cubin.loaded_modules():
        yield from (f.value for f in module.functions.values())


def apply() -> None:
    """Set CARVEOUT on every kernel loaded so far (once each); nothing where it is negative."""
    if CARVEOUT < 0:
        return
    from .cubin import driver

    for handle in _handles():
        if handle not in _done:
            code = driver().cuFuncSetAttribute(ctypes.c_void_p(handle), _PREFERRED, CARVEOUT)
            if code != 0:
                raise RuntimeError(f"DFLASH_CARVEOUT={CARVEOUT}: cuFuncSetAttribute failed with CUDA error {code}")
            _done.add(handle)
