"""The optimisation loop every stage shares: AdamW with warm-up and cosine decay, bf16 autocast on
CUDA, gradient clipping, and a checkpoint every few hundred steps that a rerun resumes from.

Batches are drawn from a generator seeded by (seed, stage, step), so a resumed run sees the same
batches as an uninterrupted one. A `Stop` due after a step (a time limit, or a Ctrl-C) saves a checkpoint
there and raises Paused: the next run resumes at that step."""

from __future__ import annotations

import math
import os
import zlib
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch

from .stop import Stop

Report = Callable[[str, int, int, dict], None]  # stage, step, total steps, metrics


class Paused(Exception):
    """A stage stopped (a time limit, a Ctrl-C) with its progress saved; rerunning resumes it."""

    def __init__(self, stage: str, done: int, total: int):
        super().__init__(f"{stage} paused at {done}/{total}")
        self.stage, self.done, self.total = stage, done, total


SEED_LIMIT = 2**40  # |seed| up to this: seed * 1_000_003 + the stage's and step's terms stay in manual_seed's int64 range


def batch_generator(seed: int, stage: str, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(stage.encode()) * 7919 + step)


def autocast(device: torch.device):
    """bf16 autocast on CUDA (parameters stay float32); full precision elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    frac = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def optimise(stage: str, params: list[torch.nn.Parameter], loss_fn: Callable[[torch.Generator], tuple],
             steps: int, lr: float, work: Path, seed: int, device: torch.device, report: Report,
             save_every: int = 250, stop: Stop | None = None) -> None:
    """loss_fn(generator) -> (loss tensor, {metric: tensor}); runs steps [resume point, steps)."""
    decay = [p for p in params if p.dim() >= 2]
    plain = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    ckpt = Path(work) / f"{stage}.ckpt.pt"
    start = 0
    if ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        with torch.no_grad():
            for p, saved in zip(params, state["params"]):
                p.copy_(saved)
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
    if stop is not None and stop.interrupted and start < steps:  # Ctrl-C during the stage before: no step of this one
        raise Paused(stage, start, steps)
    log_every = 1 if steps <= 100 else 10
    amp = autocast(device)
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        with amp:
            loss, metrics = loss_fn(batch_generator(seed, stage, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        logged = done % log_every == 0 or done == steps or done == start + 1
        if logged:
            report(stage, done, steps, _shown(loss, metrics))
        halt = done < steps and stop is not None and stop()
        if halt and not logged:  # the readout ends where the stage paused
            report(stage, done, steps, _shown(loss, metrics))
        if done % save_every == 0 or done == steps or halt:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"step": done, "params": [p.detach() for p in params], "opt": opt.state_dict()}, tmp)
            os.replace(tmp, ckpt)
        if halt:
            raise Paused(stage, done, steps)


def _shown(loss: torch.Tensor, metrics: dict) -> dict:
    """The step's readout (a device sync on CUDA: only on the steps that are shown)."""
    return {"loss": float(loss.detach()), **{k: float(v) for k, v in metrics.items()}}
