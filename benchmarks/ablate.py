"""GPU: what the non-GEMM kernels of a step cost inside its CUDA graph (an upper bound on any fusion).

Times graph replays of the decode step (ctx 1024 and 8192) and the 16-row verify with kernels taken out:
ABLATE is a comma list of
  norms   - the residual add + RMSNorm kernels (x is the GEMM's output, h unchanged)
  qkrope  - the fused q/k-norm + RoPE + cache-write kernel (q passes through)
  merge   - the attention merge kernel (the split kernel still runs)
  attn    - the attention split and merge kernels, and the fresh path's (q/k norm, RoPE, cache write; an empty
            output)
The output is garbage; only the timing means something. Each variant runs in its own process (the patches
are module attributes read at capture). Prints one line per variant: `ablate <name>: decode ... ms`.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import prefilled_graphs, replay_ms  # noqa: E402
from dflash_cli.engine import ops  # noqa: E402
from dflash_cli.engine.kernels import attention  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402

CTX = 1024


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def patch(parts: set[str]) -> None:
    if "norms" in parts:
        ops.add_rms_norm = lambda h, delta, weight, eps: (h, delta)
    if "qkrope" in parts:
        ops.qk_norm_rope_write = lambda q, *args: q
    if "merge" in parts:
        attention._merge_kernel = _NoLaunch()
    if "attn" in parts:
        # Decode steps and short spans attend straight from the projection (attend_fresh: q/k norm, RoPE and the
        # cache write inside the split kernel): those go too.
        ops.attention_window = ops.attend_fresh = _no_attention


def _no_attention(q, *args):
    """An attention's output for q [T, H, D], uncomputed."""
    return torch.empty((q.shape[0], q.shape[1] * q.shape[2]), dtype=q.dtype, device=q.device)


def main():
    parts = {p for p in os.environ.get("ABLATE", "").split(",") if p}
    patch(parts)
    torch.manual_seed(0)
    model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    _, _, graphs = prefilled_graphs(model, CTX)
    one = replay_ms(lambda: graphs([5], CTX, (), False), 100)
    span = replay_ms(lambda: graphs(list(range(16)), CTX, (), True), 100)
    long = replay_ms(lambda: graphs([5], 8 * CTX, (), False), 100)
    print(f"ablate {'+'.join(sorted(parts)) or 'none'}: decode {one:.3f} ms, verify 16 rows {span:.3f} ms, "
          f"decode at ctx {8 * CTX} {long:.3f} ms")


if __name__ == "__main__":
    main()
