"""Checkpoints stream to the GPU through pinned staging buffers (loading/weights.py): every tensor arrives as the
CPU load has it, cast where the dtype differs, whatever its size against the staging chunk."""

import pytest
import torch
from safetensors.torch import save_file

from dflash_cli.loading import weights

pytestmark = pytest.mark.gpu


def test_streamed_tensors_equal_the_cpu_load(tmp_path, monkeypatch):
    monkeypatch.setattr(weights._Stream, "CHUNK", 4096)  # many chunks a tensor, and rows longer than a chunk
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(300, 64, generator=g, dtype=torch.float32).to(torch.bfloat16),
               "b.weight": torch.randn(7, 3000, generator=g).to(torch.bfloat16),
               "norm.weight": torch.randn(513, generator=g).to(torch.bfloat16),
               "wide": torch.randn(5, 17, generator=g),  # float32: cast on the device
               "d2t": torch.arange(100, dtype=torch.int64), "t2d": torch.rand(77, generator=g) > 0.5}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    got = weights.load_tensors(tmp_path, shapes, torch.bfloat16, "cuda")
    for name, t in tensors.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert got[name].device.type == "cuda" and got[name].dtype == want.dtype, name
        assert torch.equal(got[name].cpu(), want), name
