"""One L1 / shared-memory split for every kernel of a step (comparisons: DFLASH_CARVEOUT, a percentage of the
most shared memory an SM has).

Each kernel asks for its own split by default. An SM holding blocks under one split takes a block that needs
another only once it has drained, so a kernel that asks for a different split than the one before it cannot
overlap it (programmatic dependent launch). `apply` sets one preferred split on every Triton kernel compiled so
far and on the CUDA GEMM's functions; graphs call it after their warm-up, before the capture.
"""

from __future__ import annotations

import ctypes

from ..switches import env_number

CARVEOUT = env_number("DFLASH_CARVEOUT", None, int)
_PREFERRED_SHARED_MEMORY_CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
_done: set[int] = set()


def _handles():
    import triton

    from . import attention, cuda_gemm, elementwise, greedy, skinny_gemm

    for mod in (attention, elementwise, greedy, skinny_gemm):
        for fn in vars(mod).values():
            if isinstance(fn, triton.runtime.jit.JITFunction):
                for caches in getattr(fn, "device_caches", {}).values():
                    for kernel in caches[0].values():
                        if getattr(kernel, "function", None):
                            yield kernel.function
    for state in cuda_gemm._state.values():
        if not isinstance(state, str):
            yield from (f.value for f in state.functions.values())


def apply() -> None:
    """Set DFLASH_CARVEOUT on every kernel compiled so far (once each); nothing when it is unset."""
    if CARVEOUT is None:
        return
    driver = ctypes.CDLL("libcuda.so.1")
    for handle in _handles():
        if handle not in _done:
            code = driver.cuFuncSetAttribute(ctypes.c_void_p(handle), _PREFERRED_SHARED_MEMORY_CARVEOUT, CARVEOUT)
            if code != 0:
                raise RuntimeError(f"carveout {CARVEOUT}: CUDA driver error {code}")
            _done.add(handle)
