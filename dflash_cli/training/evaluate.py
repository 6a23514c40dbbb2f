"""How well the trained drafters predict their target, measured with the engine itself: greedy
generations from held-out prompts, plain and speculative, through the published-layout files."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..runtime.generation import PlainDecoder, Request, generate
from ..runtime.sampling import SamplingParams
from ..runtime.session import Session
from ..runtime.speculative import SpeculativeDecoder
from .presets import Preset

EVAL_PROMPT = 64  # tokens of held-out text each evaluation prompt holds


def held_out_prompts(held: torch.Tensor, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens spread evenly over the held-out stream."""
    step = max(1, (held.numel() - length) // n)
    return [held[i * step : i * step + length].tolist() for i in range(n)]


def evaluate(out: Path, target, eos: int, held: torch.Tensor, p: Preset, note) -> dict:
    """`target`: the model as loaded from out/target; drafters are loaded from out/dflash, out/eagle3."""
    from ..runtime.drafters import LOADERS

    prompts = held_out_prompts(held, p.eval_prompts, EVAL_PROMPT)
    params = SamplingParams(temperature=0.0)
    results = {}
    plain = _run(target, PlainDecoder(), prompts, params, p, eos)
    results["none"] = plain
    for kind, draft_len in (("dflash", None), ("eagle3", p.draft_len)):
        if not (out / kind / "model.safetensors").is_file():
            continue
        decoder = SpeculativeDecoder(LOADERS[kind](out / kind, target), draft_len)
        r = _run(target, decoder, prompts, params, p, eos)
        r["lossless"] = r.pop("tokens") == plain["tokens"]
        results[kind] = r
        note(f"{kind}: mean accepted length {r['mean_accepted']:.2f} on {len(prompts)} held-out prompts, "
             f"{r['tok_per_s']:.0f} tok/s vs plain {plain['tok_per_s']:.0f} ({device_name(target.device)}), "
             f"greedy output {'identical to' if r['lossless'] else 'DIFFERENT from'} plain")
    results["none"].pop("tokens")
    return {"prompts": len(prompts), "max_tokens": p.eval_tokens, "modes": results}


def _run(target, decoder, prompts, params, p: Preset, eos: int) -> dict:
    session = Session(target, min(p.context, EVAL_PROMPT + p.eval_tokens + 32))
    tokens, steps, committed, seconds = [], 0, 0, 0.0
    for ids in prompts:
        session.reset()  # the speculative decoder resets its drafter on a fresh session
        t0 = time.perf_counter()
        r = generate(session, decoder, Request(ids, params, p.eval_tokens, (eos,)))
        seconds += time.perf_counter() - t0
        tokens.append(r.tokens)
        steps += len(r.steps)
        committed += sum(len(s.emitted) for s in r.steps)
    n = sum(len(t) for t in tokens)
    return {"tokens": tokens, "generated": n, "tok_per_s": round(n / seconds, 1),
            "mean_accepted": round(committed / max(steps, 1), 3)}


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
