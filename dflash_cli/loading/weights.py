"""Read safetensors checkpoints (single file or sharded) against an expected tensor list."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..errors import DflashError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
TORCH_NAME = "pytorch_model.bin"  # some EAGLE-3 drafters ship only this


def tensor_files(model_dir: Path, role: str = "model") -> dict[str, Path]:
    """Map each tensor name to the file that holds it. `role` names the checkpoint in errors ("target", ...)."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DflashError(f"corrupt shard index of the {role} {index}: {exc}") from None
        files = {name: model_dir / fname for name, fname in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise DflashError(f"missing shard {path.name} of the {role} (listed in {index})")
        return files
    single = model_dir / SINGLE_NAME
    if single.is_file():
        return {name: single for name in _names_in(single, role)}
    others = sorted(model_dir.glob("*.safetensors"))
    if len(others) == 1:
        return {name: others[0] for name in _names_in(others[0], role)}
    legacy = model_dir / TORCH_NAME
    if legacy.is_file():
        return {name: legacy for name in _names_in(legacy, role)}
    raise DflashError(f"no safetensors weights for the {role} in {model_dir} (expected {SINGLE_NAME} or {INDEX_NAME})")


class _TorchFile:
    """safe_open's interface over a pytorch_model.bin (memory-mapped, tensors only, no pickled code)."""

    def __init__(self, path: Path, role: str):
        try:
            self.tensors = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # torch raises many kinds for a corrupt or unsafe pickle
            raise DflashError(_unreadable(path, role, exc)) from None
        if not isinstance(self.tensors, dict):
            raise DflashError(_unreadable(path, role, "not a state dict"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def keys(self):
        return list(self.tensors)

    def get_slice(self, name):
        return self.tensors[name]

    def get_tensor(self, name):
        return self.tensors[name]


def _open(path: Path, role: str):
    if path.suffix == ".bin":
        return _TorchFile(path, role)
    return safe_open(str(path), framework="pt")


def _unreadable(path: Path, role: str, why) -> str:
    """Which file of which checkpoint (the target's, a drafter's) could not be read, and why."""
    return f"cannot read {path.name} of the {role} in {path.parent}: {why}"


def _names_in(path: Path, role: str) -> list[str]:
    try:
        with _open(path, role) as f:
            return list(f.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise DflashError(_unreadable(path, role, exc)) from None


def load_tensors(
    model_dir: Path,
    expected: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    device: torch.device | str,
    optional: set[str] = frozenset(),
    ignore_prefixes: tuple[str, ...] = (),
    rename=None,
    role: str = "model",
) -> dict[str, torch.Tensor]:
    """Load exactly the `expected` tensors (name -> shape), each cast to dtype on device.

    `rename` maps a checkpoint name to ours (or None to skip it). Every missing,
    unexpected or wrongly shaped tensor is counted in one error that names the first few; `role` ("target",
    "DFlash drafter", ...) says whose checkpoint it is.
    Files are memory-mapped, so a tensor is materialised once, at its destination.
    """
    files = tensor_files(model_dir, role)
    by_file: dict[Path, list[tuple[str, str]]] = {}
    unexpected = []
    for ckpt_name, path in files.items():
        ours = rename(ckpt_name) if rename else ckpt_name
        if ours is None or ckpt_name.startswith(ignore_prefixes):
            continue
        if ours not in expected:
            unexpected.append(ckpt_name)
            continue
        by_file.setdefault(path, []).append((ckpt_name, ours))
    found = {ours for pairs in by_file.values() for _, ours in pairs}
    missing = [n for n in expected if n not in found and n not in optional]
    problems = []
    if missing:
        problems.append("missing tensors: " + _names(missing))
    if unexpected:
        problems.append("unexpected tensors: " + _names(unexpected))
    if problems:
        raise DflashError(f"the {role} checkpoint in {model_dir} does not match its config: " + "; ".join(problems))

    out: dict[str, torch.Tensor] = {}
    bad_shapes = []
    device = torch.device(device)
    stream = _Stream(device) if device.type == "cuda" else None
    for path, pairs in by_file.items():
        try:
            with _open(path, role) as f:
                for ckpt_name, ours in pairs:
                    shape = tuple(_shape(f.get_slice(ckpt_name)))
                    if shape != tuple(expected[ours]):
                        bad_shapes.append(f"{ckpt_name} {list(shape)} != expected {list(expected[ours])}")
                        continue
                    if stream is not None and path.suffix != ".bin":
                        out[ours] = stream.load(f.get_slice(ckpt_name), shape, dtype)
                        continue
                    out[ours] = _to(f.get_tensor(ckpt_name), device, dtype)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise DflashError(_unreadable(path, role, exc)) from None
    if stream is not None:
        stream.finish()
    if bad_shapes:
        raise DflashError(f"the {role} checkpoint in {model_dir} has wrongly shaped tensors: " + _names(bad_shapes))
    return out


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class _Stream:
    """Checkpoint tensors to a CUDA device through pinned staging buffers: a chunk of rows is read from the
    memory-mapped file into one buffer while the device copies the chunk before out of another, so the weights
    stream at the device's copy rate instead of a pageable copy's."""

    CHUNK = 64 << 20  # bytes a staging buffer holds
    BUFFERS = 3

    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device)
        self.buffers = [torch.empty(self.CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(self.BUFFERS)]
        self.done = [None] * self.BUFFERS  # the copy event each buffer waits on before its next fill
        self.turn = 0

    def load(self, sl, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The tensor behind a safetensors slice on the device, floating point cast to dtype there."""
        src = _DTYPES.get(sl.get_dtype())
        row = src.itemsize * math.prod(shape[1:]) if src is not None and shape else 0  # bytes of one row
        if not 0 < row <= self.CHUNK:  # a dtype of its own, a scalar, or a row beyond a staging buffer: plain copy
            return _to(sl[:] if shape else sl[...], self.device, dtype)
        raw = torch.empty(shape, dtype=src, device=self.device)
        rows = self.CHUNK // row
        flat = raw.view(shape[0], -1).view(torch.uint8)  # [rows, bytes of a row]
        for a in range(0, shape[0], rows):
            b = min(shape[0], a + rows)
            part = sl[a:b]
            buf = self._buffer()
            n = part.numel() * part.element_size()
            buf[:n].view(part.dtype).view(part.shape).copy_(part)
            with torch.cuda.stream(self.side):
                flat[a:b].view(-1).copy_(buf[:n], non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.side)
            self.done[self.turn] = event
            self.turn = (self.turn + 1) % self.BUFFERS
        if src.is_floating_point and src != dtype:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
            return raw.to(dtype)
        return raw

    def _buffer(self) -> torch.Tensor:
        if self.done[self.turn] is not None:
            self.done[self.turn].synchronize()  # its last chunk has reached the device
        return self.buffers[self.turn]

    def finish(self) -> None:
        """Every copy done, before anyone reads the tensors."""
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        self.side.synchronize()


def _to(t: torch.Tensor, device, dtype: torch.dtype) -> torch.Tensor:
    """t on device, floating point cast to dtype."""
    return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)


def _shape(t) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t.get_shape())


def _names(items: list[str], limit: int = 3) -> str:
    """The first few, and how many more: an error stays one readable line when every tensor is wrong."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
