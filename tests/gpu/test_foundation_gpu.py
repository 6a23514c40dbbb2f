"""GPU check for the foundation: bf16 CUDA path vs the float32 CPU reference, plus decode speed.

Run on a CUDA machine: `python -m pytest -m gpu -s tests/gpu`.
"""

import json
import os
import time

import pytest
import torch

from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.models.qwen3 import Qwen3Model, checkpoint_shapes
from dflash_cli.synthetic import target_config, random_tensors

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def greedy(model, prompt, steps):
    session = Session(model, max_len=len(prompt) + steps + 8)
    return generate(session, PlainDecoder(), Request(prompt, SamplingParams(), max_tokens=steps))


def report(name, data):
    print(f"\n[{name}] " + json.dumps(data))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(data, f, indent=1)


def test_bf16_cuda_agrees_with_fp32_cpu_reference_qwen3_4b_shapes():
    cfg = target_config("qwen3-4b", max_position_embeddings=4096)
    shapes = checkpoint_shapes(cfg)
    w32 = random_tensors(shapes, "cuda", torch.float32, seed=0)
    gpu = Qwen3Model(cfg, {k: v.to(torch.bfloat16) for k, v in w32.items()}, "cuda", torch.bfloat16)
    cpu = Qwen3Model(cfg, {k: v.cpu() for k, v in w32.items()}, "cpu", torch.float32)
    del w32
    torch.cuda.empty_cache()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (32,), generator=g).tolist()
    steps = 64

    t0 = time.perf_counter()
    ref = greedy(cpu, prompt, steps)
    cpu_s = time.perf_counter() - t0
    fast = greedy(gpu, prompt, steps)
    first_diff = next((i for i, (a, b) in enumerate(zip(ref.tokens, fast.tokens)) if a != b), None)
    margin = None
    if first_diff is not None:
        # Re-run the fp32 reference up to the divergence and measure its top-2 margin there.
        s = Session(cpu, max_len=len(prompt) + steps + 8)
        logits = s.forward(prompt + ref.tokens[:first_diff], all_logits=False).logits[-1]
        top2 = logits.topk(2).values
        margin = float(top2[0] - top2[1])
        rel = margin / float(logits.abs().max())
        assert rel < 0.01, f"bf16 diverged at step {first_diff} where fp32 is not a near-tie (margin {margin})"

    # Decode speed (eager, no CUDA graphs yet) over more steps.
    warm = greedy(gpu, prompt, 16)
    speed = greedy(gpu, prompt, 256)
    report("gpu_foundation", {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": "qwen3-4b (random weights, bf16)",
        "agree_steps": steps if first_diff is None else first_diff,
        "first_divergence": first_diff,
        "fp32_top2_margin_at_divergence": margin,
        "cpu_fp32_64_steps_s": round(cpu_s, 2),
        "eager_decode_tok_per_s": round(speed.decode_tok_per_s, 2),
        "eager_ms_per_token": round(1000 / speed.decode_tok_per_s, 3),
        "ttft_32_tokens_s": round(speed.ttft_s, 4),
        "warmup_tokens": len(warm.tokens),
    })
