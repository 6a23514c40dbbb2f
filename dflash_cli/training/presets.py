"""Sizes and schedules of a demo training run. `demo` is what ships; `tiny` runs in seconds on a
CPU (tests, and a quick look at the pipeline)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..errors import DflashError


@dataclass(frozen=True)
class Preset:
    name: str
    # data and tokenizer
    max_corpus_bytes: int
    vocab_size: int
    # target (Qwen3 architecture)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    context: int
    target_steps: int
    target_batch: int
    target_lr: float
    # distillation data: real prompts continued by the target (greedy, some sampled)
    distill_sequences: int
    distill_prompt: int
    distill_batch: int
    distill_length: int  # prompt + continuation: the early continuation is what a drafter meets most
    sampled_fraction: float
    # DFlash drafter
    dflash_layers: int
    dflash_target_layers: tuple[int, ...]
    block_size: int
    dflash_blocks: int  # blocks per sequence per step
    dflash_steps: int
    # EAGLE-3 drafter
    draft_vocab: int
    ttt_steps: int  # chained steps unrolled in training-time test
    eagle3_steps: int
    draft_len: int
    drafter_batch: int
    drafter_lr: float
    eval_prompts: int
    eval_tokens: int
    save_every: int = 250  # steps between resumable checkpoints

    def summary(self) -> dict:
        return asdict(self)


DEMO = Preset(
    name="demo", max_corpus_bytes=48_000_000, vocab_size=4096,
    hidden=256, layers=8, heads=4, kv_heads=2, head_dim=64, intermediate=768, context=1024,
    target_steps=3000, target_batch=24, target_lr=2e-3,
    distill_sequences=6144, distill_prompt=64, distill_batch=512, distill_length=320, sampled_fraction=0.25,
    dflash_layers=2, dflash_target_layers=(1, 4, 6), block_size=16, dflash_blocks=16, dflash_steps=5000,
    draft_vocab=2048, ttt_steps=5, eagle3_steps=1500, draft_len=6, drafter_batch=64, drafter_lr=2e-3,
    eval_prompts=16, eval_tokens=128,
)

TINY = replace(
    DEMO, name="tiny", max_corpus_bytes=400_000, vocab_size=320,
    hidden=32, layers=4, heads=2, kv_heads=1, head_dim=16, intermediate=64, context=96,
    target_steps=6, target_batch=4, distill_sequences=6, distill_prompt=8, distill_batch=4, distill_length=48,
    dflash_layers=1, dflash_target_layers=(0, 2), block_size=4, dflash_blocks=3, dflash_steps=4,
    draft_vocab=200, ttt_steps=3, eagle3_steps=4, draft_len=3, drafter_batch=3, eval_prompts=2, eval_tokens=12, save_every=2,
)

PRESETS = {p.name: p for p in (DEMO, TINY)}


def get(name: str) -> Preset:
    if name not in PRESETS:
        raise DflashError(f"unknown preset '{name}' (choose from {', '.join(PRESETS)})")
    return PRESETS[name]
