"""`dflash train demo`: tokenizer -> target -> distillation data -> DFlash -> EAGLE-3 -> evaluation.

Every stage leaves its result in the output folder and is skipped when that result exists; a stage
cut short resumes from its last checkpoint under `work/`. The three model folders are in the
published layouts and load with `--model DIR/target --draft DIR/dflash` (or DIR/eagle3)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch

from ..layers import ops
from ..errors import DflashError
from . import bpe, corpus, distill, presets
from . import dflash as dflash_stage
from . import eagle3 as eagle3_stage
from . import target as target_stage
from .evaluate import device_name, evaluate
from .loop import Report, autocast, batch_generator, optimise
from .params import target_tensors

STAGES = ("tokenizer", "target", "distill", "dflash", "eagle3", "evaluate")
Note = Callable[[str], None]


def train_demo(out: Path, preset: presets.Preset, roots: list[Path], device: torch.device, seed: int,
               report: Report, note: Note, stages=STAGES) -> dict:
    out = Path(out)
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise DflashError(f"unknown stage(s) {', '.join(sorted(unknown))} (stages: {', '.join(STAGES)})")
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    with ops.reference_only():  # the fused Triton kernels have no backward
        return _train(out, work, preset, roots, device, seed, report, note, stages)


def _train(out: Path, work: Path, preset: presets.Preset, roots, device, seed: int, report: Report, note: Note,
           stages) -> dict:
    torch.manual_seed(seed)
    info = _read_info(out)
    earlier = (info.get("preset", {}).get("name"), info.get("seed"))
    if earlier[0] is not None and earlier != (preset.name, seed):
        raise DflashError(f"{out} holds a run with preset {earlier[0]} and seed {earlier[1]}: resume it with the same "
                          f"--preset and --seed, or train into a new folder")
    info.update({"preset": preset.summary(), "seed": seed})
    _write_info(out, info)  # now, so that a cut-short run is resumed only with its own settings
    tdir, ddir, edir = out / "target", out / "dflash", out / "eagle3"

    t0 = time.perf_counter()
    data = corpus.collect(roots, preset.max_corpus_bytes)
    info["data"] = {"roots": [str(r) for r in roots], "files": data.files, "bytes": data.bytes,
                    "held_out_files": len(data.held_out), "digest": data.digest}
    if not (tdir / "tokenizer.json").is_file():
        if "tokenizer" not in stages:
            raise DflashError(f"{tdir} has no tokenizer: run the tokenizer stage first")
        note(f"tokenizer: byte-level BPE, {preset.vocab_size} tokens, from {data.files} files ({data.bytes / 1e6:.1f} MB)")
        bpe.train(data.train, preset.vocab_size, tdir)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
    eos, mask = tok.token_to_id(corpus.SEPARATOR), tok.token_to_id(bpe.MASK)
    train_ids, held_ids = _tokens(work, tok, data)
    info["data"].update(train_tokens=int(train_ids.numel()), held_out_tokens=int(held_ids.numel()))
    note(f"data: {train_ids.numel():,} training tokens, {held_ids.numel():,} held out "
         f"({time.perf_counter() - t0:.0f} s)")

    if not (tdir / "model.safetensors").is_file() and "target" in stages:
        model, params = target_stage.build(preset, eos, seed, device)
        n = sum(p.numel() for p in params)
        note(f"target: Qwen3, {n / 1e6:.2f} M parameters, {preset.target_steps} steps of "
             f"{preset.target_batch}x{preset.context} tokens")
        stream = train_ids.to(device)
        optimise("target", params, lambda g: (target_stage.loss(
            model, target_stage.windows(stream, preset.target_batch, preset.context + 1, g)), {}),
            preset.target_steps, preset.target_lr, work, seed, device, report, preset.save_every)
        target_stage.export(model, preset, eos, tdir)
        del model, params
    if not set(stages) - {"tokenizer", "target"} and not (tdir / "model.safetensors").is_file():
        return info  # nothing after the stages asked for needs the target
    target = _load_target(tdir, device)
    info["target_parameters"] = sum(t.numel() for t in target_tensors(target).values())

    seqs_path = work / "distill.pt"
    if not seqs_path.is_file() and any(s in stages for s in ("distill", "dflash", "eagle3")):
        note(f"distill: {preset.distill_sequences} prompts of {preset.distill_prompt} tokens continued by the "
             f"target to {preset.distill_length}")
        seqs = _distill(target, train_ids, preset, seed, device)
        torch.save(seqs.to(torch.int16 if preset.vocab_size <= 32767 else torch.int32), seqs_path)
    seqs = torch.load(seqs_path, weights_only=True).long() if seqs_path.is_file() else None

    if not (ddir / "model.safetensors").is_file() and "dflash" in stages:
        drafter, params = dflash_stage.build(preset, target, eos, mask, seed + 1)
        note(f"dflash: {len(drafter.layers)} layers, block {preset.block_size}, "
             f"{sum(p.numel() for p in params) / 1e6:.2f} M parameters, {preset.dflash_steps} steps")
        data_dev = seqs.to(device)
        optimise("dflash", params, lambda g: dflash_stage.loss(
            drafter, _rows(data_dev, preset.drafter_batch, g), preset.distill_prompt, preset.dflash_blocks, g),
            preset.dflash_steps, preset.drafter_lr, work, seed, device, report, preset.save_every)
        dflash_stage.export(drafter, preset, eos, mask, ddir)
        del drafter, params
    if not (edir / "model.safetensors").is_file() and "eagle3" in stages:
        ids, t2d = eagle3_stage.draft_vocab(seqs, preset.draft_vocab, preset.vocab_size)
        drafter, params = eagle3_stage.build(preset, target, ids, seed + 2)
        to_draft = torch.full((preset.vocab_size,), -100, dtype=torch.long)
        to_draft[ids] = torch.arange(len(ids))
        coverage = float(t2d[seqs[:, preset.distill_prompt:]].float().mean())
        note(f"eagle3: draft vocabulary {preset.draft_vocab} ({coverage:.1%} of the target's tokens), "
             f"training-time test over {preset.ttt_steps} steps, {preset.eagle3_steps} steps")
        data_dev, to_draft = seqs.to(device), to_draft.to(device)
        optimise("eagle3", params, lambda g: eagle3_stage.loss(
            drafter, _rows(data_dev, preset.drafter_batch, g), preset.distill_prompt, preset.ttt_steps, to_draft),
            preset.eagle3_steps, preset.drafter_lr, work, seed, device, report, preset.save_every)
        eagle3_stage.export(drafter, preset, t2d, edir)
        del drafter, params

    if "evaluate" in stages:
        info["evaluation"] = evaluate(out, target, eos, held_ids, preset, note)
        info["evaluation"]["held_out_loss"] = target_stage.held_out_loss(target, held_ids, min(512, preset.context))
        note(f"target held-out loss {info['evaluation']['held_out_loss']:.3f} nats/token")
    info["versions"] = {"torch": torch.__version__, "device": device_name(device)}
    _write_info(out, info)
    return info


def _write_info(out: Path, info: dict) -> None:
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")


def _rows(seqs: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    return seqs[torch.randint(0, seqs.shape[0], (n,), generator=gen).to(seqs.device)]


def _tokens(work: Path, tok, data) -> tuple[torch.Tensor, torch.Tensor]:
    path = work / f"tokens-{data.digest}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return saved["train"], saved["held_out"]
    train, held = bpe.encode(tok, data.train), bpe.encode(tok, data.held_out)
    torch.save({"train": train, "held_out": held}, path)
    return train, held


def _load_target(tdir: Path, device):
    from ..models.qwen3 import Qwen3Model

    if not (tdir / "model.safetensors").is_file():
        raise DflashError(f"{tdir} has no trained target: run the target stage first")
    # Drafters learn from the target as it ships (bf16 weights), computed in float32 / autocast.
    return Qwen3Model.load(tdir, device=device, dtype=torch.float32)


def _distill(target, train_ids: torch.Tensor, p: presets.Preset, seed: int, device) -> torch.Tensor:
    g = batch_generator(seed, "distill", 0)
    out = []
    for i in range(0, p.distill_sequences, p.distill_batch):
        n = min(p.distill_batch, p.distill_sequences - i)
        prompts = target_stage.windows(train_ids, n, p.distill_prompt, g)
        sampled = torch.rand(n, generator=g) < p.sampled_fraction
        with autocast(device):
            out.append(distill.continue_prompts(target, prompts, p.distill_length, sampled, g))
    return torch.cat(out)


def _read_info(out: Path) -> dict:
    path = out / "training_info.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}
