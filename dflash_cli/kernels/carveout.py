"""One preferred L1 / shared-memory split for every kernel of a captured step.

Each kernel otherwise gets the driver's own choice: the products (a few KB of shared memory a block) the largest
L1, an attention split of 70-112 KB the largest shared part. An SM changes its split only once it has drained,
and under programmatic dependent launch it never drains, so the kernels after such a split ran with its small L1,
and a kernel launched early could only land on the SMs that had drained. With one preference for all (CARVEOUT
percent of the most shared memory an SM has: 43 is 100 KB, leaving 156 KB of L1), the attention can launch early
(kernels/attention.py). Measurements: docs/TUNING.md.
`apply` sets it on every kernel compiled so far; graphs call it after their warm-up, before the capture.
"""

from __future__ import annotations

import ctypes
import sys

# Percent of an SM's unified L1 / shared memory given to shared memory, the same for every kernel of a step: two
# 39 KB attention splits an SM fit, and the rest stays L1 for the products' weight loads (docs/TUNING.md).
CARVEOUT = 43
_PREFERRED = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
_done: set[int] = set()
# The modules whose Triton kernels a step launches.
STEP_MODULES = ("attention", "delta_rule", "dflash2", "elementwise", "greedy", "prefill_attention", "sampling",
                "skinny_gemm")


def compiled(modules) -> list:
    """(name, compiled kernel) of every Triton kernel of `modules` compiled so far."""
    import triton

    return [(name, kernel) for mod in modules for name, fn in vars(mod).items()
            if isinstance(fn, triton.runtime.jit.JITFunction)
            for caches in getattr(fn, "device_caches", {}).values() for kernel in caches[0].values()]


def _handles():
    """The function handles of every Triton kernel and csrc/ cubin function of the step loaded so far."""
    from . import cubin

    # Only those imported already: one not imported has compiled nothing, and importing it would cost start-up time.
    loaded = [sys.modules[m] for m in (f"{__package__}.{name}" for name in STEP_MODULES) if m in sys.modules]
    for _, kernel in compiled(loaded):
        if getattr(kernel, "function", None):
            yield int(kernel.function)
    for module in cubin.loaded_modules():
        yield from (f.value for f in module.functions.values())


def apply() -> None:
    """Set CARVEOUT on every kernel loaded so far (once each)."""
    from .cubin import driver

    for handle in _handles():
        if handle not in _done:
            code = driver().cuFuncSetAttribute(ctypes.c_void_p(handle), _PREFERRED, CARVEOUT)
            if code != 0:
                raise RuntimeError(f"carveout {CARVEOUT}%: cuFuncSetAttribute failed with CUDA error {code}")
            _done.add(handle)
