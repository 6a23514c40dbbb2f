"""GPU check of Qwen3.5's fused decode step: the hybrid as loaded on the GPU (norm weights folded into the products,
the adds and norms inside them, q/k norm + partial RoPE + KV write + attention + output gate in the attention's
kernels, graphs) against the same weights unfolded on the eager path and an fp32 reference.

Run on a CUDA machine: `python -m pytest -m gpu -s tests/gpu -k hybrid`.
"""

import pytest
import torch

from dflash_cli.kernels import attention
from dflash_cli.layers import ops
from dflash_cli.runtime.session import Session
from dflash_cli.synthetic import random_target

from test_foundation_gpu import report

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPT, STEPS = 300, 16
# Relative L2 error of the decode steps' logits, fused bf16 against unfolded bf16: both round every product's output
# to bf16, through 32 layers here (the DFlash drafter's folded check allows 3e-2 through its 5).
FUSED_VS_PLAIN = 5e-2
# The fused path's error against fp32 may exceed the unfolded path's by this factor (and 1e-3): folding rounds the
# weights once more, and nothing else should cost accuracy.
FUSED_VS_FP32 = 1.5


def test_fused_hybrid_decode_matches_the_unfolded_eager_model_bf16(monkeypatch):
    """Qwen3.5-4B shapes, random weights: after a 300-token prompt, 16 decode steps' logits of the fused bf16 graphs
    agree with the unfolded bf16 eager model's within FUSED_VS_PLAIN, and against fp32 they are within FUSED_VS_FP32 of
    the unfolded error; every attention layer's decode step ran the fresh kernel with its gate in the merge."""
    torch.backends.cuda.matmul.allow_tf32 = False
    over = dict(max_position_embeddings=4096)
    fused = random_target("qwen3.5-4b", "cuda", torch.bfloat16, seed=0, **over)
    assert ops.folds_norms("cuda", torch.bfloat16) and all(layer.norms_folded for layer in fused.layers)
    with monkeypatch.context() as m:
        m.setattr(ops, "folds_norms", lambda device, dtype: False)
        plain = random_target("qwen3.5-4b", "cuda", torch.bfloat16, seed=0, **over)
    fp32 = random_target("qwen3.5-4b", "cuda", torch.float32, seed=0, **over)
    gated = []
    real = attention.attention_fresh

    def counted(*a, gate=None, **kw):
        gated.append(gate is not None)
        return real(*a, gate=gate, **kw)

    monkeypatch.setattr(attention, "attention_fresh", counted)
    ids = torch.randint(0, fused.cfg.vocab_size, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(1))
    prompt, steps = ids[:PROMPT].tolist(), ids[PROMPT:].tolist()
    logits = {}
    for name, model, path in (("fused", fused, "graphs"), ("plain", plain, "eager"), ("fp32", fp32, "eager")):
        session = Session(model, 512, path=path)
        session.forward(prompt)
        logits[name] = torch.stack([session.forward([t]).logits[-1].float() for t in steps])
        if name == "fused":
            attention_layers = len(model.cfg.attention_layers)
            assert len(gated) >= attention_layers and all(gated), gated  # the decode graph's capture
    err = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    fused_plain = err(logits["fused"], logits["plain"])
    fused_fp32, plain_fp32 = err(logits["fused"], logits["fp32"]), err(logits["plain"], logits["fp32"])
    report("hybrid_fused", {"device": torch.cuda.get_device_name(), "fused_vs_plain": fused_plain,
                            "fused_vs_fp32": fused_fp32, "plain_vs_fp32": plain_fp32})
    assert fused_plain <= FUSED_VS_PLAIN
    assert fused_fp32 <= FUSED_VS_FP32 * plain_fp32 + 1e-3
