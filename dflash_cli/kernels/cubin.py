"""CUDA C++ kernels of csrc/: built with nvcc on first use, loaded and launched through the CUDA driver API.

A source is compiled to a cubin for the GPU at hand and cached under ~/.cache/dflash/kernels (keyed by source,
architecture, nvcc and flags), then loaded with cuModuleLoadData through ctypes: no torch extension build, no
Python headers. Launches go on torch's current stream, so CUDA graphs capture them like any other kernel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import torch

from .. import tuning

# The sources live in the checkout's csrc/ (the README installs editable); a wheel without them keeps the
# kernels' fallbacks.
CSRC = Path(__file__).resolve().parents[2] / "csrc"

# CUlaunchAttributeID values used here.
PROGRAMMATIC_STREAM_SERIALIZATION = 6
COOPERATIVE = 2
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_SHARED_OPTIN = 97  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN


def source(name: str) -> Path | None:
    path = CSRC / name
    return path if path.is_file() else None


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def build(src: Path, arch: str, flags: list[str]) -> bytes:
    """The cubin of `src` for `arch` (e.g. sm_90a), from the cache or built now."""
    compiler = nvcc()
    if compiler is None:
        raise RuntimeError("nvcc not found")
    # The compiler's identity from its file, not `nvcc --version` (a process on every start): a new toolkit is a new
    # file (path, size or time)
    real = Path(compiler).resolve()
    stat = real.stat()
    version = f"{real}:{stat.st_size}:{stat.st_mtime_ns}"
    key = hashlib.sha256(src.read_bytes() + arch.encode() + version.encode() + " ".join(flags).encode())
    key = key.hexdigest()[:16]
    cache = tuning.KNOBS.kernel_cache
    cubin = cache / f"{src.stem}-{arch}-{key}.cubin"
    if not cubin.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        target = [f"-gencode=arch=compute_{arch[3:]},code={arch}"]  # the -arch shorthand rejects sm_90a's own PTX
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            out = Path(tmp) / "k.cubin"
            subprocess.run([compiler, "-cubin", *target, "-O3", *flags, "-o", str(out), str(src)],
                           capture_output=True, text=True, check=True)
            os.replace(out, cubin)  # atomic: a concurrent build never leaves half a file
    return cubin.read_bytes()


_loaded: dict = {}  # (source name, device index) -> Module, or why there is none (str)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def load(name: str, device: torch.device, arch: Callable[[int, int], str], what: str,
         make: Callable[[torch.device, bytes], Module] | None = None, flags: tuple[str, ...] = ()) -> Module | str:
    """csrc/`name` loaded on `device` (once per device), or why it cannot be (a str starting with `what`).
    arch(major, minor): the target (e.g. sm_90a), or RuntimeError where this GPU cannot run the kernel;
    make: the Module subclass to build; flags: the caller's nvcc flags."""
    key = (name, _index(device))
    if key not in _loaded:
        try:
            major, minor = torch.cuda.get_device_capability(key[1])
            target = arch(major, minor)
            src = source(name)
            if src is None:
                raise RuntimeError(f"csrc/{name} not found")
            with torch.cuda.device(key[1]):
                _loaded[key] = (make or Module)(torch.device("cuda", key[1]), build(src, target, list(flags)))
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            _loaded[key] = f"{what} unavailable: {exc}"
    return _loaded[key]


def loaded_modules() -> list[Module]:
    """Every cubin loaded so far, on any device."""
    return [m for m in _loaded.values() if isinstance(m, Module)]


def tried(name: str, device: torch.device) -> Module | str | None:
    """What `load` gave for csrc/`name` on `device` (None: not tried yet)."""
    return _loaded.get((name, _index(device)))


class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id and a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def attribute(kind: int, value: int = 1) -> LaunchAttribute:
    attr = LaunchAttribute(kind, 0)
    attr.value[0] = value
    return attr


class Ptr(int):
    """A device address argument (plain ints are C ints, floats C floats)."""


def c_args(args: list) -> list:
    """Kernel arguments as ctypes values: Ptr -> void*, float -> float, int -> int, ctypes values as they are."""
    return [a if isinstance(a, (ctypes._SimpleCData, ctypes.Structure)) else ctypes.c_void_p(a)
            if isinstance(a, Ptr) else ctypes.c_float(a) if isinstance(a, float) else ctypes.c_int(a) for a in args]


@functools.cache
def driver() -> ctypes.CDLL:
    """The CUDA driver library, loaded once (cubins and kernels/carveout.py call it)."""
    return ctypes.CDLL("libcuda.so.1")


class Module:
    """A loaded cubin on one device (its primary context) and its functions."""

    def __init__(self, device: torch.device, image: bytes):
        self.driver = driver()
        self.device = device
        torch.cuda.synchronize(device)  # the primary context is current on this thread
        self.module = ctypes.c_void_p()
        self.check(self.driver.cuModuleLoadData(ctypes.byref(self.module), image), "cuModuleLoadData")
        self.functions: dict[str, ctypes.c_void_p] = {}

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed with CUDA driver error {code}")

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self.functions:
            fn = ctypes.c_void_p()
            self.check(self.driver.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode()), name)
            self.functions[name] = fn
        return self.functions[name]

    def shared_optin(self) -> int:
        """The most dynamic shared memory a block of this device may ask for."""
        value, dev = ctypes.c_int(), ctypes.c_int()
        self.check(self.driver.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
        self.check(self.driver.cuDeviceGetAttribute(ctypes.byref(value), _SHARED_OPTIN, dev), "cuDeviceGetAttribute")
        return value.value

    def allow_shared(self, name: str, smem: int) -> None:
        """Let `name` launch with `smem` bytes of dynamic shared memory (above 48 KB it must ask)."""
        self.check(self.driver.cuFuncSetAttribute(self.function(name), _MAX_DYNAMIC_SHARED, smem), "cuFuncSetAttribute")

    def launch(self, name: str, grid: tuple[int, int], block: int, smem: int, args: list,
               attrs: tuple[LaunchAttribute, ...] = ()) -> None:
        """One launch on torch's current stream; args as `c_args` takes them."""
        values = c_args(args)
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if attrs:
            array = (LaunchAttribute * len(attrs))(*attrs)
            cfg = _LaunchConfig((grid[0], grid[1], 1), (block, 1, 1), smem, stream, array, len(attrs))
            code = self.driver.cuLaunchKernelEx(ctypes.byref(cfg), self.function(name), params, None)
        else:
            code = self.driver.cuLaunchKernel(self.function(name), grid[0], grid[1], 1, block, 1, 1, smem, stream,
                                              params, None)
        self.check(code, f"launch of {name}")
