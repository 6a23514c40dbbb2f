"""`dflash train demo`: tokenizer -> target -> distillation data -> DFlash -> block size -> DFlash 2's selector ->
EAGLE-3 -> evaluation.

Every stage leaves its result in the output folder and is skipped when that result exists; a stage
cut short (an error, or a second Ctrl-C) resumes from its last checkpoint under `work/`; `time_limit` reached or a
Ctrl-C during a training loop or the distillation stops at the next step or part, saved there.
The three model folders are in the published layouts; `--model DIR` loads the target with its drafters
(registry.trained_run), `--model DIR/target --draft DIR/dflash` (or DIR/eagle3) each on its own. training_info.json records, per stage, the seconds it took (summed over
the runs that worked on it) and where it ran."""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from ..errors import DflashError
from ..layers import ops
from . import bpe, corpus, distill, presets, prompts
from . import dflash as dflash_stage
from . import eagle3 as eagle3_stage
from . import selector as selector_stage
from . import target as target_stage
from .evaluate import THREADS, WHERE, cpu_threads, device_name, evaluate
from .loop import Paused, Report, autocast, optimise
from .stop import Stop
from .params import target_tensors

DEFAULT = "T=0.0"  # the demo's default decoding (greedy: its generation_config), which the block choice serves
# Candidates this close in tok/s tie, and the higher τ ships: the same drafter on the same prompts ran at 148 and 134
# tok/s in two runs of the block stage on a 2-core CPU (2026-12-04).
SPEED_TIE = 0.10

STAGES = ("tokenizer", "target", "distill", "dflash", "block", "selector", "eagle3", "evaluate")
Note = Callable[[str], None]
CPU = torch.device("cpu")


def train_demo(out: Path, preset: presets.Preset, roots: list[Path], device: torch.device, seed: int,
               report: Report, note: Note, stages=None, time_limit: float | None = None) -> dict:
    """stages: the ones to run (None: all, except an evaluation done before when no stage trained anything now);
    time_limit: seconds after which the run stops at the next checkpoint it can resume from (info["paused"]); a
    Ctrl-C in a training loop or the distillation does the same at once."""
    out = Path(out)
    asked = stages is not None
    stages = STAGES if stages is None else check_stages(stages)
    check_inputs(out, stages)
    with only_run(out), ops.reference_only():  # the fused Triton kernels have no backward
        run = _Run(out, out / "work", preset, roots, device, seed, report, note, stages, Stop(time_limit))
        run.evaluate_again = asked
        try:
            return run.train()
        except Paused as e:
            run.info["paused"] = {"stage": e.stage, "done": e.done, "total": e.total, "by": run.stop.reason}
            run.write_info()
            note(f"{run.stop.reason}: {e.stage} paused at {e.done}/{e.total} with its progress saved; "
                 f"run the same command again to resume")
            return run.info


class _Run:
    def __init__(self, out, work, p, roots, device, seed, report, note, stages, stop):
        self.out, self.work, self.p, self.roots, self.device, self.seed = out, work, p, roots, device, seed
        self.report, self.note, self.stages, self.stop = report, note, stages, stop
        self.info = _read_info(out)
        self.worked: set[str] = set()  # the stages this run did work in, but the data stage
        self.evaluate_again = True  # False: an evaluation done before is kept when no stage worked

    def write_info(self) -> None:
        (self.out / "training_info.json").write_text(json.dumps(self.info, indent=2) + "\n")

    @contextmanager
    def timed(self, stage: str, where: str):
        """Adds the stage's seconds (also when it is cut short) and where it ran (every device, once) to
        info["stages"]."""
        t0 = time.perf_counter()
        done = False
        if stage != "data":
            self.worked.add(stage)
        try:
            yield
            done = True
        finally:
            took = time.perf_counter() - t0
            s = self.info.setdefault("stages", {}).setdefault(stage, {"seconds": 0.0})
            s["seconds"] = round(s["seconds"] + took, 1)
            ran = s.get("device")  # a stage resumed elsewhere (started on a GPU, finished on a CPU) names both
            s["device"] = where if ran is None else ran if where in ran.split(" + ") else f"{ran} + {where}"
            s["finished"] = done
            s["data"] = self.info.get("data", {}).get("digest")  # the corpus this run read (info["corpora"])
            self.write_info()
        self.note(f"{stage}: {took:.0f} s on {where} (this run; {s['seconds']:.0f} s in all)")

    def unless_interrupted(self, stage: str) -> None:
        """A Ctrl-C in the last step of a training stage stops the run before a stage with no steps to pause at."""
        if self.stop.interrupted:
            raise Paused(stage, 0, 1)

    def train(self) -> dict:
        p, out, work, device, seed, note, stages = (self.p, self.out, self.work, self.device, self.seed, self.note,
                                                    self.stages)
        torch.manual_seed(seed)
        info = self.info
        self.info.pop("paused", None)
        check_same_run(out, p, seed)
        info.update({"preset": p.summary(), "seed": seed})
        # torch per device a run of this folder used (the stages say which device each ran on).
        versions = {k: v for k, v in info.get("versions", {}).items() if k not in ("torch", "device")}
        info["versions"] = {**versions, device_name(device): torch.__version__}
        self.write_info()  # now, so that a cut-short run is resumed only with its own settings
        tdir, ddir, sdir, edir = out / "target", out / "dflash", out / "dflash2", out / "eagle3"
        here = device_name(device)

        with self.timed("data", "cpu"):
            data = corpus.collect(self.roots, p.max_corpus_bytes)
            # Stages may run on machines with different Python source (train on a GPU, measure on a CPU): every
            # corpus a run read is kept, and each stage names its own. Held-out files are the same on both where
            # their relative paths are (corpus._is_held_out).
            corpora = info.setdefault("corpora", {})
            if "digest" in info.get("data", {}):
                corpora.setdefault(info["data"]["digest"], info["data"])
            info["data"] = corpora[data.digest] = {
                "roots": [str(r) for r in self.roots], "files": data.files, "bytes": data.bytes,
                "held_out_files": len(data.held_out), "digest": data.digest}
            if not (tdir / "tokenizer.json").is_file():  # the tokenizer stage is asked for: check_inputs
                note(f"tokenizer: byte-level BPE, {p.vocab_size} tokens, from {data.files} files "
                     f"({data.bytes / 1e6:.1f} MB)")
                bpe.train(data.train, p.vocab_size, tdir)
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
            eos, mask = tok.token_to_id(corpus.SEPARATOR), tok.token_to_id(bpe.MASK)
            train_ids, held_ids = _tokens(work, tok, data)
            info["data"].update(train_tokens=int(train_ids.numel()), held_out_tokens=int(held_ids.numel()))
        note(f"data: {train_ids.numel():,} training tokens, {held_ids.numel():,} held out")

        if not (tdir / "model.safetensors").is_file() and "target" in stages:
            with self.timed("target", here):
                model, params = target_stage.build(p, eos, seed, device)
                n = sum(q.numel() for q in params)
                note(f"target: Qwen3, {n / 1e6:.2f} M parameters, {p.target_steps} steps of "
                     f"{p.target_batch}x{p.context} tokens")
                stream = train_ids.to(device)
                self.optimise("target", params, lambda g: (target_stage.loss(
                    model, target_stage.windows(stream, p.target_batch, p.context + 1, g)), {}),
                    p.target_steps, p.target_lr)
                target_stage.export(model, p, eos, tdir)
                del model, params
        if not set(stages) - {"tokenizer", "target"} and not (tdir / "model.safetensors").is_file():
            return info  # nothing after the stages asked for needs the target
        target = _load_target(tdir, device)
        info["target_parameters"] = sum(t.numel() for t in target_tensors(target).values())

        first = work / f"dflash-b{p.block_size}"
        candidates = {b: work / f"dflash-b{b}" for b in (p.block_size, *p.block_sizes)}  # the first one first
        needs_data = ("distill" in stages or ("dflash" in stages and not all(map(_done, candidates.values())))
                      or ("selector" in stages and not _done(sdir)) or ("eagle3" in stages and not _done(edir)))
        parts = work / "distill"
        last_part = parts / distill.part_name(distill.parts(p) - 1)  # written last: the data is complete
        if needs_data and not last_part.is_file():
            with self.timed("distill", here):
                self.distill(target, train_ids, parts, eos)
        seqs = distill.load(parts, p, eos).to(device) if last_part.is_file() and needs_data else None
        if seqs is not None:
            info["distill"] = {"sequences": int(seqs.tokens.shape[0]),
                               "target_tokens": int(seqs.produced().sum()), "width": int(seqs.tokens.shape[1])}

        if "dflash" in stages:  # the first block size, then the others fine-tuned from it
            for b, folder in candidates.items():
                tuned = b != p.block_size  # fine-tuned from the first
                if not _done(folder):
                    with self.timed(folder.name, here):
                        self.train_dflash(target, seqs, eos, mask, b, p.block_steps if tuned else p.dflash_steps,
                                          folder, first if tuned else None)
        if not _done(ddir) and "block" in stages:
            missing = [f.name for f in candidates.values() if not _done(f)]
            if missing:
                raise DflashError(f"no trained drafter in {', '.join(missing)}: run the dflash stage first")
            self.unless_interrupted("block")
            self.choose_block(tok, data, eos, candidates, ddir)

        if not _done(sdir) and "selector" in stages:
            if not _done(ddir):
                raise DflashError(f"no DFlash drafter in {ddir}: run the dflash and block stages first")
            with self.timed("selector", here):
                self.train_selector(target, seqs, eos, mask, ddir, sdir)

        if not _done(edir) and "eagle3" in stages:
            with self.timed("eagle3", here):
                produced = seqs.produced()
                ids, t2d = eagle3_stage.draft_vocab(seqs.tokens[produced].cpu(), p.draft_vocab, p.vocab_size)
                drafter, params = eagle3_stage.build(p, target, ids, seed + 2)
                to_draft = torch.full((p.vocab_size,), -100, dtype=torch.long)
                to_draft[ids] = torch.arange(len(ids))
                coverage = float(t2d[seqs.tokens[produced].long().cpu()].float().mean())
                note(f"eagle3: draft vocabulary {p.draft_vocab} ({coverage:.1%} of the target's tokens), "
                     f"training-time test over {p.ttt_steps} steps, {p.eagle3_steps} steps")
                to_draft = to_draft.to(device)

                def eagle3_loss(g):
                    rows = _rows(seqs, p.drafter_batch, g)
                    return eagle3_stage.loss(drafter, rows.tokens, rows.produced(), p.ttt_steps, to_draft)

                self.optimise("eagle3", params, eagle3_loss, p.eagle3_steps, p.drafter_lr)
                eagle3_stage.export(drafter, p, t2d, edir)
                del drafter, params

        evaluated = info.get("stages", {}).get("evaluate", {}).get("finished") and "evaluation" in info
        if "evaluate" in stages and evaluated and not (self.evaluate_again or self.worked):
            note("evaluate: done before, nothing trained since (training_info.json \"evaluation\"); "
                 "--stages evaluate measures again")
        elif "evaluate" in stages:
            self.unless_interrupted("evaluate")
            with self.timed("evaluate", WHERE), cpu_threads(THREADS):
                cpu_target = _load_target(tdir, CPU)
                test = prompts.category_prompts(data.held_out, tok, p.eval_prompts, 64, prompts.TEST)
                # eagle3-shipped: a drafter kept for comparison (benchmarks/train_demo_gpu.sh puts the shipped one there)
                drafters = {k: out / k for k in ("dflash", "dflash2", "eagle3", "eagle3-shipped") if _done(out / k)}
                info["evaluation"] = evaluate(cpu_target, eos, test, p, drafters, note)
            info["evaluation"]["held_out_loss"] = target_stage.held_out_loss(target, held_ids, min(512, p.context))
            note(f"target held-out loss {info['evaluation']['held_out_loss']:.3f} nats/token")
        self.write_info()
        return info

    def optimise(self, stage, params, loss_fn, steps, lr):
        with self.stop.on_ctrl_c(self.note):
            optimise(stage, params, loss_fn, steps, lr, self.work, self.seed, self.device, self.report,
                     self.p.save_every, self.stop)

    def distill(self, target, train_ids, parts: Path, eos: int) -> None:
        p = self.p
        n = distill.parts(p)
        parts.mkdir(exist_ok=True)
        self.note(f"distill: {p.distill_sequences} rows in {n} parts; prompts of {p.distill_prompts} tokens "
                  f"({p.synth_fraction:.0%} written by the target), continuations of {p.distill_continuations} "
                  f"({p.sampled_fraction:.0%} sampled at T {p.sample_temperatures}, the rest greedy)")
        with self.stop.on_ctrl_c(self.note):
            for i in range(n):
                path = parts / distill.part_name(i)
                if path.is_file():
                    continue
                if self.stop.interrupted:  # Ctrl-C during the stage before
                    raise Paused("distill", i, n)
                with autocast(self.device):
                    part = distill.make_part(target, train_ids, p, self.seed, i, eos)
                tmp = path.with_suffix(".tmp")
                torch.save(part, tmp)
                tmp.replace(path)
                self.report("distill", i + 1, n, {"rows": min((i + 1) * p.distill_batch, p.distill_sequences)})
                if i + 1 < n and self.stop():
                    raise Paused("distill", i + 1, n)

    def train_dflash(self, target, seqs, eos, mask, block, steps, folder: Path, start: Path | None) -> None:
        p = self.p
        drafter, params = dflash_stage.build(p, target, eos, mask, self.seed + 1, block, start)
        self.note(f"dflash: {len(drafter.layers)} layers tapping target layers {list(p.dflash_target_layers)}, "
                  f"block {block} (loss decay gamma {presets.loss_gamma(block)}), "
                  f"{sum(q.numel() for q in params) / 1e6:.2f} M parameters, {steps} steps of {p.dflash_batch} rows "
                  f"x {p.dflash_blocks} blocks" + (f", from {start.name}" if start else ""))
        self.optimise(folder.name, params, lambda g: dflash_stage.loss(
            drafter, _rows(seqs, p.dflash_batch, g), p.dflash_blocks, g), steps, p.drafter_lr)
        dflash_stage.export(drafter, p, eos, mask, folder)

    def train_selector(self, target, seqs, eos, mask, ddir: Path, sdir: Path) -> None:
        """DFlash 2's candidate selector over the frozen shipped DFlash drafter (training/selector.py)."""
        p = self.p
        block = json.loads((ddir / "config.json").read_text())["block_size"]
        drafter, _ = dflash_stage.build(p, target, eos, mask, self.seed, block, ddir)
        params = [q.to(self.device).detach().requires_grad_() for q in selector_stage.build(
            p.vocab_size, p.hidden, p.selector_rank, self.seed + 3)]
        self.note(f"selector: top-{p.selector_top_k} candidates, rank {p.selector_rank}, over the block-{block} "
                  f"drafter; {p.selector_steps} steps of {p.dflash_batch} rows x {p.selector_anchors} blocks")
        self.optimise("selector", params, lambda g: selector_stage.loss(
            params, drafter, _rows(seqs, p.dflash_batch, g), p.selector_anchors, p.selector_top_k, g),
            p.selector_steps, p.selector_lr)
        selector_stage.export(ddir, sdir, params, p.selector_top_k)

    def choose_block(self, tok, data, eos: int, folders: dict[int, Path], ddir: Path) -> None:
        """Measures every candidate drafter (block size -> folder) on the held-out selection prompts (CPU, the
        product's threads; greedy and T 0.6) and ships the fastest at the demo's default, greedy decoding (of those
        within SPEED_TIE of it, the one with the highest greedy τ)."""
        p = self.p
        with self.timed("block", WHERE), cpu_threads(THREADS):
            scores = {}
            if len(folders) > 1:
                cpu_target = _load_target(self.out / "target", CPU)
                select = prompts.category_prompts(data.held_out, tok, p.eval_prompts, 64, prompts.SELECT)
                r = evaluate(cpu_target, eos, select, p,
                             {f"dflash-b{b}": f for b, f in folders.items()}, self.note)
                for b in folders:
                    modes = {k: t[f"dflash-b{b}"] for k, t in r["temperatures"].items()}
                    scores[b] = {"tok_per_s": modes[DEFAULT]["tok_per_s"],
                                 **{f"tok_per_s {k}": m["tok_per_s"] for k, m in modes.items()},
                                 **{f"tau {k}": m["mean_accepted"] for k, m in modes.items()}}
                best = max(scores[b]["tok_per_s"] for b in folders)
                tied = [b for b in folders if scores[b]["tok_per_s"] >= (1 - SPEED_TIE) * best]
                chosen = max(tied, key=lambda b: scores[b][f"tau {DEFAULT}"])
            else:
                chosen = p.block_size
            _copy_whole(folders[chosen], ddir)
            self.info["block_choice"] = {"chosen": chosen, "candidates": {str(b): s for b, s in scores.items()},
                                         "rule": f"highest greedy tok/s ({WHERE}) on the held-out selection "
                                                 "prompts, the demo's default decoding; within "
                                                 f"{SPEED_TIE:.0%} of it, the highest greedy τ"}
        speeds = ", ".join(f"{b}: {s['tok_per_s']} tok/s" for b, s in scores.items())
        self.note(f"block: {chosen} ships" + (f" ({speeds})" if scores else ""))


@contextmanager
def only_run(out: Path):
    """One run at a time in a folder (two wrote the same checkpoints and one failed on the other's renamed file); the
    lock goes with the process, however it ends."""
    try:
        (out / "work").mkdir(parents=True, exist_ok=True)
        lock = open(out / "work" / "lock", "a")
    except OSError as e:
        raise DflashError(f"cannot write to {out}: {e.strerror}") from None
    with lock:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            yield
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DflashError(f"another dflash train is running in {out}: wait for it to end (or stop it), or train "
                              f"into another folder") from None
        except OSError:  # a filesystem without locks (Lustre mounted without flock, some FUSE ones: ENOSYS): no lock
            pass
        yield


def check_stages(stages) -> tuple[str, ...]:
    """Stage names as given, in the pipeline's names (an error lists them)."""
    stages = tuple(stages)
    if not stages:
        raise DflashError(f"--stages names no stage (stages: {','.join(STAGES)})")
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise DflashError(f"unknown stage(s) {', '.join(unknown)} (stages: {','.join(STAGES)})")
    return stages


def check_inputs(out: Path, stages) -> None:
    """Up front, before the data stage reads and tokenizes the corpus: the stages asked for have what they start from."""
    if "tokenizer" not in stages and not (out / "target" / "tokenizer.json").is_file():
        raise DflashError(f"{out / 'target'} has no tokenizer: run the tokenizer stage first")
    if (set(stages) - {"tokenizer", "target"} and "target" not in stages
            and not (out / "target" / "model.safetensors").is_file()):
        raise DflashError(f"{out / 'target'} has no trained target: run the target stage first")


def check_same_run(out: Path, preset: presets.Preset, seed: int) -> None:
    """A folder that holds a run is resumed only with that run's preset and seed."""
    info = _read_info(Path(out))
    earlier = (info.get("preset", {}).get("name"), info.get("seed"))
    if earlier[0] is not None and earlier != (preset.name, seed):
        raise DflashError(f"{out} holds a run with preset {earlier[0]} and seed {earlier[1]}: resume it with the "
                          f"same --preset and --seed, or train into a new folder")


def _copy_whole(src: Path, dst: Path) -> None:
    """A copy that is there whole or not at all: a Ctrl-C while copying left a truncated model.safetensors that every
    later run took as the shipped drafter."""
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def _done(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file()


def _rows(seqs: distill.Distilled, n: int, gen: torch.Generator) -> distill.Distilled:
    return seqs.rows(torch.randint(0, seqs.tokens.shape[0], (n,), generator=gen).to(seqs.tokens.device))


def _tokens(work: Path, tok, data) -> tuple[torch.Tensor, torch.Tensor]:
    path = work / f"tokens-{data.digest}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return saved["train"], saved["held_out"]
    train, held = bpe.encode(tok, data.train), bpe.encode(tok, data.held_out)
    tmp = path.with_suffix(".tmp")  # a Ctrl-C while saving must not leave a truncated file the next run loads
    torch.save({"train": train, "held_out": held}, tmp)
    tmp.replace(path)
    return train, held


def _load_target(tdir: Path, device):
    from ..models.qwen3 import Qwen3Model

    if not (tdir / "model.safetensors").is_file():
        raise DflashError(f"{tdir} has no trained target: run the target stage first")
    # Drafters learn from the target as it ships (bf16 weights), computed in float32 / autocast.
    return Qwen3Model.load(tdir, device=device, dtype=torch.float32)


def _read_info(out: Path) -> dict:
    path = out / "training_info.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}
