"""Sizes and schedules of a demo training run. `demo` is what ships; `tiny` runs in seconds on a
CPU (tests, and a quick look at the pipeline). The DFlash recipe follows z-lab's published one
(docs/demo-training.md has the sources): 5 drafter layers tapping the target at z-lab's default
spread, the frozen target embedding and head, distinct random anchors in the target's own
continuations, and the block loss decay exp(-(k-1)/gamma)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..errors import DflashError
from ..models.dflash import default_target_layers

# Loss decay per block size: w_k = exp(-(k-1)/gamma) for block position k >= 1. gamma 7 for block 16: SpecForge
# examples/run_qwen3_8b_dflash_online.sh `--loss-decay-gamma 7.0` (z-lab's training port); 8 -> 4 and 10 -> 5 as
# SpecForge's launch notes advise, and ModelOpt's dflash.yaml defaults (block 8, decay 4.0).
LOSS_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
MB = 1_000_000
# The identity convolutions a selector stage's DFlash 2 drafter carries: DFlash 2's published two-tap form.
CONV_TAPS, CONV_GROUP = 2, 16
SHIPPED_LIMIT = 30 * MB  # the demo's three folders (target, dflash2, eagle3), the budget


def loss_gamma(block: int) -> float:
    return LOSS_GAMMA.get(block, block / 2)


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
    # distillation data: prompts continued by the target itself, in parts of distill_batch rows; each part draws
    # one prompt length and one continuation length from the lists (varied lengths); a row's prompt is a window
    # of the training files at a random offset or, with synth_fraction, written by the target at temperature 1
    # from a file start; a row's continuation is greedy or, with sampled_fraction, sampled at one of
    # sample_temperatures.
    distill_sequences: int
    distill_prompts: tuple[int, ...]
    distill_continuations: tuple[int, ...]  # short ones: long greedy continuations end in loops
    distill_batch: int
    sampled_fraction: float
    sample_temperatures: tuple[float, ...]
    synth_fraction: float
    # DFlash drafter
    dflash_layers: int
    dflash_target_layers: tuple[int, ...]
    block_size: int  # the block trained first
    dflash_blocks: int  # distinct anchors (blocks) per sequence per step
    dflash_batch: int  # sequences per step
    dflash_steps: int
    block_sizes: tuple[int, ...]  # candidates; the others are fine-tuned from block_size's drafter
    block_steps: int  # fine-tuning steps of each other candidate
    # EAGLE-3 drafter
    draft_vocab: int
    ttt_steps: int  # chained steps unrolled in training-time test
    eagle3_steps: int
    draft_len: int
    drafter_batch: int
    drafter_lr: float
    eval_prompts: int  # per category of held-out prompts
    eval_tokens: int
    save_every: int = 250  # steps between resumable checkpoints
    # DFlash 2's candidate selector over the shipped DFlash drafter (training/selector.py): K candidates a row,
    # codebooks of rank R, steps of dflash_batch rows x selector_anchors blocks. K 16 and R 16: the best T 0.6 τ of
    # three H200 variants on the selection prompts (K 8: 2.72, K 16: 3.09, K 16 R 32: 3.02; docs/demo-training.md).
    selector_top_k: int = 16
    selector_rank: int = 16
    selector_anchors: int = 8
    selector_steps: int = 1500
    selector_lr: float = 3e-3
    eagle3_layers: tuple[int, ...] = ()  # EAGLE-3's target taps (inputs of these layers); () is (2, L/2, L-3)

    def summary(self) -> dict:
        return asdict(self)

    @property
    def distill_width(self) -> int:
        return max(self.distill_prompts) + max(self.distill_continuations)

    def shipped_bytes(self) -> dict[str, int]:
        """bf16 checkpoint bytes of the three models (the tokenizer and configs add about 0.3 MB)."""
        h, d = self.hidden, self.head_dim
        layer = h * d * (self.heads + 2 * self.kv_heads) + self.heads * d * h + 3 * h * self.intermediate + 2 * h + 2 * d
        target = self.vocab_size * h + self.layers * layer + h
        dflash = self.dflash_layers * layer + len(self.dflash_target_layers) * h * h + 2 * h
        # DFlash 2's form (what ships): per layer two identity convolutions, and the selector
        convs = self.dflash_layers * 2 * (2 * CONV_TAPS * h + 2 * CONV_TAPS * (h // CONV_GROUP) * h)
        dflash2 = dflash + convs + 2 * self.vocab_size * self.selector_rank + self.selector_rank * h
        eagle3 = layer - 2 * h + 3 * h * h + 2 * h * h + self.draft_vocab * h + 3 * h  # fc over 3 taps, 2h-wide qkv input
        return {"target": 2 * target, "dflash2": 2 * dflash2, "eagle3": 2 * eagle3 + 9 * self.vocab_size}


DEMO = Preset(
    name="demo", max_corpus_bytes=48_000_000, vocab_size=4096,
    hidden=256, layers=8, heads=4, kv_heads=2, head_dim=64, intermediate=768, context=1024,
    target_steps=3000, target_batch=24, target_lr=2e-3,
    # 65,536 continuations (10.7x the 6,144 before), about 9 M target tokens; z-lab regenerate their whole training
    # set with the target (SpecForge run_qwen3_8b_dflash_online.sh trains on perfectblend_qwen3-8b_regen).
    distill_sequences=65_536, distill_prompts=(16, 32, 64, 128), distill_continuations=(48, 96, 160, 256),
    # Sampled at 0.6 (the T) and 1.0 (the target's own distribution); not published: z-lab's regen settings
    # are not in the sources read (docs/demo-training.md).
    distill_batch=2048, sampled_fraction=0.5, sample_temperatures=(0.6, 1.0), synth_fraction=0.25,
    # 5 layers: SpecForge configs/qwen3-8b-dflash.json num_hidden_layers 5 (z-lab's Qwen3-8B-DFlash-b16).
    # Taps (1, 2, 3, 4, 5): z-lab's build_target_layer_ids(8, 5) (dflash/model.py: 1 .. L-3, evenly spread).
    dflash_layers=5, dflash_target_layers=tuple(default_target_layers(8, 5)),
    # Block 16: z-lab's released b16 drafters and SpecForge's default; 8 is the other candidate (ModelOpt's default).
    # 7000 steps of 64 rows: 6.8 passes over the rows (SpecForge's recipe: 6 epochs); 325 s on an H200.
    # 32 anchors a row: SpecForge's --num-anchors 512 per --max-length 3072 (1 in 6 positions) on our ~200-token rows.
    block_size=16, dflash_blocks=32, dflash_batch=64, dflash_steps=7000, block_sizes=(16, 8), block_steps=600,
    # EAGLE-3 sees the same rows as the DFlash drafter (7000 steps of 64): the fair comparison.
    draft_vocab=2048, ttt_steps=5, eagle3_steps=7000, draft_len=6, drafter_batch=64, drafter_lr=2e-3,
    eval_prompts=4, eval_tokens=128,
)

TINY = replace(
    DEMO, name="tiny", max_corpus_bytes=400_000, vocab_size=320,
    hidden=32, layers=4, heads=2, kv_heads=1, head_dim=16, intermediate=64, context=96,
    target_steps=6, target_batch=4, distill_sequences=10, distill_prompts=(6, 10), distill_continuations=(12, 20),
    distill_batch=4, dflash_layers=2, dflash_target_layers=(0, 2), block_size=4,  # z-lab's spread repeats a tap at 4
    dflash_blocks=3, dflash_batch=3, dflash_steps=4, block_sizes=(4, 3), block_steps=2,
    draft_vocab=200, ttt_steps=3, eagle3_steps=4, draft_len=3, drafter_batch=3, eval_prompts=1, eval_tokens=12, save_every=2,
    selector_top_k=4, selector_rank=4, selector_anchors=2, selector_steps=3,
)

PRESETS = {p.name: p for p in (DEMO, TINY)}


def get(name: str) -> Preset:
    if name not in PRESETS:
        raise DflashError(f"unknown preset '{name}' (choose from {', '.join(PRESETS)})")
    return PRESETS[name]
