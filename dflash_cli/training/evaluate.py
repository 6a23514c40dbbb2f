"""How well the trained drafters predict their target, measured with the engine itself: generations from
held-out prompts by category (training/prompts.py), plain and speculative, greedy and at temperature 0.6,
through the published-layout files. Run on the CPU with the thread count the product gives the demo, so the speeds are the
product's (`dflash bench --model demo` on a 2-core CPU)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import torch

from ..runtime.generation import PlainDecoder, Request, generate
from ..runtime.sampling import SamplingParams
from ..runtime.session import Session
from ..runtime.speculative import SpeculativeDecoder
from .presets import Preset

EVAL_PROMPT = 64  # tokens of held-out text each evaluation prompt holds at most
TEMPERATURES = (0.0, 0.6)
# The product's threads for a model the demo's size (commands/common.set_threads: one; more are slower there).
THREADS = 1
WHERE = f"cpu ({THREADS} thread{'s' * (THREADS > 1)})"  # how a stage timed here names where it ran


def held_out_prompts(held: torch.Tensor, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens spread evenly over the held-out stream (benchmarks/sampled_acceptance.py)."""
    step = max(1, (held.numel() - length) // n)
    return [held[i * step : i * step + length].tolist() for i in range(n)]


@contextmanager
def cpu_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def evaluate(target, eos: int, prompts: list[tuple[str, list[int]]], p: Preset, drafters: dict[str, Path], note,
             temperatures=TEMPERATURES) -> dict:
    """target: the model from out/target on the device it runs on; drafters: name -> folder (DFlash, DFlash 2 or
    EAGLE-3 by its config). Returns per temperature and mode: generated tokens, tok/s, mean accepted length (τ: tokens
    committed per target step) overall and per category, and (greedy) whether the output equals plain."""
    from ..runtime.drafters import detect_kind, load

    results = {}
    for temp in temperatures:
        params = lambda i: SamplingParams(temperature=temp, seed=i)  # noqa: E731 - one seed per prompt
        plain = _run(target, PlainDecoder(), prompts, params, p, eos)
        modes = {"none": plain}
        for name, folder in drafters.items():
            kind = detect_kind(folder)
            decoder = SpeculativeDecoder(load(kind, folder, target), p.draft_len if kind == "eagle3" else None)
            r = _run(target, decoder, prompts, params, p, eos)
            if temp == 0:
                r["lossless"] = r["tokens"] == plain["tokens"]
            modes[name] = r
            note(f"{name} T={temp}: τ {r['mean_accepted']:.2f} on {len(prompts)} held-out prompts "
                 f"({', '.join(f'{c} {t:.2f}' for c, t in r['by_category'].items())}), {r['tok_per_s']:.0f} tok/s "
                 f"vs plain {plain['tok_per_s']:.0f} ({device_name(target.device)})"
                 + (f", greedy output {'identical to' if r['lossless'] else 'DIFFERENT from'} plain" if temp == 0 else ""))
        for r in modes.values():
            r.pop("tokens")
        results[f"T={temp}"] = modes
    categories = sorted({c for c, _ in prompts})
    return {"prompts": len(prompts), "categories": {c: sum(1 for k, _ in prompts if k == c) for c in categories},
            "max_tokens": p.eval_tokens, "device": device_name(target.device), "threads": torch.get_num_threads(),
            "temperatures": results}


def _run(target, decoder, prompts, params, p: Preset, eos: int) -> dict:
    session = Session(target, min(p.context, EVAL_PROMPT + p.eval_tokens + 32))
    generate(session, decoder, Request(prompts[0][1], params(0), p.eval_tokens, (eos,)))  # warm-up, not timed
    tokens, seconds = [], 0.0
    per_cat: dict[str, list[int]] = {}
    for i, (cat, ids) in enumerate(prompts):
        session.reset()  # the speculative decoder resets its drafter on a fresh session
        t0 = time.perf_counter()
        r = generate(session, decoder, Request(ids, params(i), p.eval_tokens, (eos,)))
        seconds += time.perf_counter() - t0
        tokens.append(r.tokens)
        c = per_cat.setdefault(cat, [0, 0])
        c[0] += sum(len(s.emitted) for s in r.steps)
        c[1] += len(r.steps)
    n = sum(len(t) for t in tokens)
    committed, steps = sum(c[0] for c in per_cat.values()), sum(c[1] for c in per_cat.values())
    return {"tokens": tokens, "generated": n, "tok_per_s": round(n / max(seconds, 1e-9), 1),
            "mean_accepted": round(committed / max(steps, 1), 3),
            "by_category": {k: round(c[0] / max(c[1], 1), 3) for k, c in sorted(per_cat.items())}}


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
