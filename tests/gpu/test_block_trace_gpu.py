"""The block trace (DFLASH_BLOCK_TRACE=1) on the GPU: every block of the traced kernels records itself, in order."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# Run in a process of its own: the switch is read at import and the GEMM is built with -DTRACE=1.
SCRIPT = r"""
import torch
from dflash_cli.layers import ops
from dflash_cli.kernels import block_trace, cuda_gemm
from dflash_cli.kernels.elementwise import add_rms_norm
from dflash_cli.kernels.attention import attention_window

assert block_trace.ON
torch.manual_seed(0)
bf, dev = torch.bfloat16, "cuda"
x, w = torch.randn(1, 2560, dtype=bf, device=dev), torch.randn(4096, 2560, dtype=bf, device=dev) / 50
y = cuda_gemm.skinny_linear(x, w)
assert (y.float() - x.float() @ w.float().T).abs().max() < 0.05
y2 = cuda_gemm.skinny_linear(x, w, config=(4, 2, 4))  # K split over two blocks: a grid of two rows
assert (y2.float() - x.float() @ w.float().T).abs().max() < 0.05
h = torch.randn(1, 2560, dtype=bf, device=dev)
add_rms_norm(h, y[:, :2560].contiguous(), torch.ones(2560, dtype=bf, device=dev), 1e-6)
q, k, v = (torch.randn(n, heads, 128, dtype=bf, device=dev) for n, heads in ((1, 32), (2048, 8), (2048, 8)))
attention_window(q, k, v, torch.tensor([1500], device=dev), 128 ** -0.5)
torch.cuda.synchronize()
kinds = [kind.split(":")[0] for kind, _ in block_trace.launches()]
assert kinds == ["gemm", "gemm", "norm", "split", "merge"], kinds


def check(launches):
    for kind, rec in launches:
        rec = rec.cpu()
        assert (rec[:, 4] == torch.arange(len(rec))).all(), kind  # every block wrote its own row
        assert ((rec[:, 0] > 0) & (rec[:, 0] <= rec[:, 1]) & (rec[:, 1] <= rec[:, 2])).all(), kind
        assert (rec[:, 2] - rec[:, 0]).max() < 1e8 and (rec[:, 3] < 1024).all(), kind  # under 0.1 s; an SM index


check(block_trace.launches())
# Captured: the graph keeps the buffer, and each replay writes it again.
block_trace.clear()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    cuda_gemm.skinny_linear(x, w, config=(4, 2, 4))
(kind, rec), = block_trace.launches()
rec.zero_()
graph.replay()
torch.cuda.synchronize()
check(block_trace.launches())
print("traced", kinds)
"""


def test_traced_kernels_record_every_block():
    from dflash_cli.kernels import cuda_gemm

    if not cuda_gemm.available(torch.device("cuda")):
        pytest.skip("the CUDA GEMM is not available here (nvcc or the GPU)")
    env = dict(os.environ, DFLASH_BLOCK_TRACE="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "traced" in out.stdout
