"""Run every selected decoding mode over the same prompts and summarise per mode."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from ..runtime.decoders import check_draft_len
from ..options import SYNTHETIC_PROMPT_LEN, BenchOptions
from ..runtime.generation import PlainDecoder, Request, Result, generate
from ..runtime.graphs import Totals
from ..runtime.sampling import SamplingParams
from ..runtime.session import Session
from ..errors import DflashError
from ..ui.stream import json_stats
from .forced import ForcedAcceptance, ForcedDecoder

BUILTIN_PROMPTS = Path(__file__).with_name("prompts.jsonl")


def parse_drafts(text: str) -> list[str]:
    return BenchOptions(draft=text).drafts


def load_prompts(path: Path | None) -> list[dict]:
    path = path or BUILTIN_PROMPTS
    out = []
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DflashError(f"cannot read prompts file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DflashError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise DflashError(f'{path}:{n}: each line must be an object with a "prompt" string')
        if not item["prompt"].strip():
            raise DflashError(f"{path}:{n}: the prompt is empty")
        out.append({"category": item.get("category", "user"), "prompt": item["prompt"]})
    if not out:
        raise DflashError(f"{path} holds no prompts")
    return out


@dataclass
class ModeRun:
    mode: str
    kind: str
    results: list[Result]
    captures_timed: int = 0  # CUDA graphs captured during this mode's timed runs (target and drafter)
    shapes_timed: int = 0  # graph keys first used during timed runs (captures on the graphs path)

    def summary(self) -> dict:
        from ..runtime.stats import step_stats

        rs = self.results
        tokens = sum(max(len(r.tokens) - 1, 0) for r in rs)
        decode = sum(r.decode_s for r in rs)
        steps = [s for r in rs for s in r.steps]
        st = step_stats(steps)
        n = max(len(steps), 1)
        return {
            "mode": self.mode,
            "draft_kind": self.kind,
            "runs": len(rs),
            "generated_tokens": sum(len(r.tokens) for r in rs),
            "decode_tok_per_s": round(tokens / decode, 3) if decode else 0.0,
            "ttft_s": round(sum(r.ttft_s for r in rs) / len(rs), 6),
            "tau": st["mean_accepted"],
            "accepted_drafts_hist": st["accept_hist"],  # [i] = steps that accepted i drafts
            "accept_rate_by_position": st["accept_by_position"],
            "draft_ms_per_step": round(st["draft_s"] / n * 1000, 4),
            "verify_ms_per_step": round(st["verify_s"] / n * 1000, 4),
            "step_ms": round(decode / n * 1000, 4),
            "graph_captures_timed": self.captures_timed,
        }


class BenchTarget:
    """What a bench runs on: a real checkpoint (tokenized prompts) or a synthetic one (random ids)."""

    def __init__(self, o: BenchOptions):
        from ..runtime.bundle import open_bundle, pick_device, pick_dtype
        from ..registry import Registry

        self.o = o
        self._decoders: dict = {}  # one decoder (and drafter, with its graphs) per mode, built once
        entry = self.entry = Registry.load().resolve(o.model)
        self.name = entry.name
        # --prompts, else the entry's own set (the demo: Python), else the built-in mix
        self.prompts = load_prompts(o.prompts or (None if o.synthetic else entry.bench_prompts))
        if o.synthetic:
            from ..synthetic import random_target

            self.device = pick_device(o.device)
            self.dtype = pick_dtype(o.dtype, self.device)
            self.model = random_target(entry.name, self.device, self.dtype, seed=o.seed)
            g = torch.Generator().manual_seed(o.seed)
            length = SYNTHETIC_PROMPT_LEN if o.synthetic_prompt_len is None else o.synthetic_prompt_len
            self.prompt_ids = [torch.randint(0, self.model.cfg.vocab_size, (length,), generator=g).tolist()
                               for _ in self.prompts]
            self.stop_ids: list[int] = []
            self.bundle = None
        else:
            self.bundle = open_bundle(entry, o.device, o.dtype)
            self.device, self.dtype = self.bundle.device, self.bundle.dtype
            tok = self.bundle.tokenizer
            self.prompt_ids = [tok.encode(tok.render_chat([{"role": "user", "content": p["prompt"]}]))
                               for p in self.prompts]
            self.stop_ids = tok.stop_ids
            self.model = self.bundle.load_model()
        longest = max(len(p) for p in self.prompt_ids)
        self.max_len = longest + o.max_tokens + 32
        limit = self.model.cfg.max_position_embeddings
        if self.max_len > limit:
            raise DflashError(f"longest prompt + --max-tokens ({self.max_len}) exceeds the model's {limit} positions")

    def decoder(self, mode: str, plain_runs: list[Result] | None, index: int | None):
        """The mode's decoder: built on first use (the warm-up), then the same object for every run,
        so no drafter is reloaded and no graph recaptured inside a timed run."""
        decoder = self._decoders.get(mode)
        if decoder is None:
            decoder = self._decoders[mode] = self._make_decoder(mode)
            check_draft_len(decoder, self.o.draft_len)  # as generate: more than the drafter proposes is an error
        if (mode != "none" and self.o.synthetic and self.o.synthetic_tau is not None
                and plain_runs is not None and index is not None):
            seq = self.prompt_ids[index] + plain_runs[index].tokens
            inner = getattr(decoder.proposer, "inner", decoder.proposer)
            decoder.proposer = ForcedAcceptance(inner, seq, self.o.synthetic_tau, self.model.cfg.vocab_size, index)
        return decoder

    def _make_decoder(self, mode: str):
        if mode == "none":
            return PlainDecoder()
        if not self.o.synthetic:
            from ..runtime.decoders import make_decoder

            return make_decoder(self.bundle, mode, self.o.draft_len)
        from ..runtime.speculative import SpeculativeDecoder
        from ..synthetic import random_drafter
        from ..runtime.drafters import KINDS, proposer

        if mode not in KINDS:
            raise DflashError(f"--synthetic takes drafter kinds ({', '.join(KINDS)}), not '{mode}'")
        drafter = proposer(mode, random_drafter(self.name, mode, self.model))
        # As for real drafters: DFlash's block is fixed by the checkpoint, EAGLE-3's chain by the registry.
        k = self.o.draft_len or (self.entry.draft_len if mode == "eagle3" else None)
        make = ForcedDecoder if self.o.synthetic_tau is not None else SpeculativeDecoder
        return make(drafter, k)


def run_modes(o: BenchOptions, on_progress=None) -> dict:
    """Run all modes; returns the report dict (figures, device, versions).

    Ctrl-C stops the whole bench at once: the report holds the modes that finished, and `interrupted` names the mode
    that was running with its timed runs done (a run cut short never enters a table); Ctrl-C before any mode finished
    propagates (KeyboardInterrupt). `on_progress(label, done, total)` follows the warm-up and the timed runs."""
    if o.max_tokens < 1 or o.repeat < 1:
        raise DflashError("--max-tokens and --repeat must be >= 1")
    if o.synthetic and o.temperature > 0:
        raise DflashError("--synthetic measures greedy steps: use --temperature 0")
    bt = BenchTarget(o)
    for mode in o.drafts:  # every drafter loads (and is checked) before the first timed run, not after a mode's runs
        bt.decoder(mode, None, None)
    # At T > 0 top-p / top-k as generate's: the flags, else the model's recommended values (--synthetic is greedy).
    params = (bt.bundle.sampling(o.temperature, o.top_p, o.top_k, o.seed) if bt.bundle is not None
              else SamplingParams(seed=o.seed))
    runs: list[ModeRun] = []
    plain_first: list[Result] | None = None
    # One session for every run: its cache and captured CUDA graphs are reused (reset = length 0).
    session = Session(bt.model, bt.max_len)
    if session.fast is not None:  # the warm-up runs each prompt once: capture its prefill graph then, and keep
        session.fast.capture_prefills = True  # one per prompt (a mode's keys are its prompts' sizes)
        session.fast.prefill_graphs = max(session.fast.prefill_graphs, len(bt.prompt_ids))
    start = Totals.snapshot()
    interrupted = None
    for mode in o.drafts:
        run = ModeRun(mode, "none", [])
        try:
            _run_mode(o, bt, session, params, run, plain_first, on_progress)
        except KeyboardInterrupt:
            interrupted = {"mode": mode, "timed_runs_done": len(run.results), "timed_runs": len(bt.prompt_ids) * o.repeat}
            if not runs:
                raise
            break
        if mode == "none":
            plain_first = run.results[: len(bt.prompt_ids)]
        runs.append(run)
    rep = report(o, bt, runs, params)
    rep["interrupted"] = interrupted
    end = Totals.snapshot()
    rep["engine"] = {
        "path": session.path,
        "graph_captures": end[1] - start[1],  # target and drafters, warm-up included
        "graph_capture_s": round(end[2] - start[2], 3),
        "graph_captures_timed": sum(r.captures_timed for r in runs),  # ideally 0
        "graph_shapes_timed": sum(r.shapes_timed for r in runs),  # the same count on the eager static path
    }
    return rep


def _run_mode(o: BenchOptions, bt: BenchTarget, session: Session, params: SamplingParams, run: ModeRun,
              plain_first: list[Result] | None, on_progress) -> None:
    """One mode: its warm-up, then its timed runs into `run`."""
    mode = run.mode
    # Repetition 0 is the warm-up, not counted: every prompt once at full length. Greedy (and
    # seeded) runs repeat exactly, so every CUDA graph the timed runs need (one per attention
    # window bucket and span size, target and drafter) is captured before anything is timed.
    for rep in range(o.repeat + 1):
        for i, ids in enumerate(bt.prompt_ids):
            decoder = bt.decoder(mode, plain_first, i)
            run.kind = decoder.kind
            session.reset()
            req = Request(ids, params, o.max_tokens, bt.stop_ids)
            before = Totals.snapshot()
            r = generate(session, decoder, req)
            if r.interrupted:
                raise KeyboardInterrupt  # generate() keeps a chat usable after Ctrl-C; a bench just stops
            if rep == 0 and on_progress:
                on_progress(f"{mode} warm-up", i + 1, len(bt.prompt_ids))
            if rep > 0:
                after = Totals.snapshot()
                run.shapes_timed += after[0] - before[0]
                run.captures_timed += after[1] - before[1]
                run.results.append(r)
                if on_progress:
                    on_progress(mode, len(run.results), len(bt.prompt_ids) * o.repeat)


def report(o: BenchOptions, bt: BenchTarget, runs: list[ModeRun], params: SamplingParams) -> dict:
    summaries = [r.summary() for r in runs]
    base = summaries[0]["decode_tok_per_s"] or None
    for s in summaries:
        s["speedup"] = round(s["decode_tok_per_s"] / base, 3) if base else None
    try:
        from importlib.metadata import version

        ours = version("dflash-cli")
    except Exception:
        ours = "unknown"
    return {
        "model": bt.name,
        "synthetic": o.synthetic,
        "synthetic_tau": o.synthetic_tau,
        "device": torch.cuda.get_device_name(bt.device) if bt.device.type == "cuda" else platform.processor() or "cpu",
        "device_type": bt.device.type,
        "dtype": str(bt.dtype).replace("torch.", ""),
        "versions": {"dflash-cli": ours, "torch": torch.__version__, "python": platform.python_version()},
        "max_tokens": o.max_tokens,
        "temperature": o.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "repeat": o.repeat,
        "prompts": [{"category": p["category"], "prompt_tokens": len(ids)} for p, ids in zip(bt.prompts, bt.prompt_ids)],
        "modes": summaries,
        "per_run": {r.mode: [{"tokens": len(x.tokens), "decode_s": round(x.decode_s, 6), "ttft_s": round(x.ttft_s, 6),
                              "steps": len(x.steps), **json_stats(x.stats())} for x in r.results] for r in runs},
    }
