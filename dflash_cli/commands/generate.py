"""`dflash generate`: one prompt, one streamed (or JSON) answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console

from .. import tuning
from ..options import GenerateOptions
from ..runtime.decoders import check_draft_len, make_decoder, unused_draft_len
from ..runtime.generation import Request, generate
from ..runtime.session import Session
from ..errors import DflashError
from ..runtime.bundle import open_bundle
from ..registry import Registry
from ..ui.stream import StreamView, footer_lines, json_stats, prompt_echo
from .common import (RepetitionGuard, StartupClock, StopTexts, capture_graphs, check_generate, finish_reason,
                     has_thinking, no_thinking, set_threads, tee, warn)

__all__ = ["GenerateOptions", "run_generate"]


def run_generate(o: GenerateOptions, console: Console, status=None) -> None:
    """The local engine's generate (commands/start.py sends --url elsewhere first). `status`: the loading line
    (ui/status.py) to take away before the answer shows."""
    clock = StartupClock()
    text = check_generate(o)
    bundle = open_bundle(Registry.load().resolve(o.model), o.device, o.dtype)
    clock.mark("tokenizer")
    tok = bundle.tokenizer
    think_flag = {True: "--think", False: "--no-think"}.get(o.think)
    if o.raw:
        if think_flag:
            warn(f"{think_flag} is ignored with --raw (no chat template)")
        ids = tok.encode(text)
        continues = True
    else:
        if think_flag and not has_thinking(tok):
            warn(f"{think_flag}: {no_thinking(bundle.entry.name)}")
        messages = ([{"role": "system", "content": o.system}] if o.system else []) + [{"role": "user", "content": text}]
        rendered = tok.render_chat(messages, think=o.think)
        ids = tok.encode(rendered)
        continues = rendered.endswith(text)  # a template that continues the text (the demo's), not a chat turn
    if not ids:
        raise DflashError("the prompt is empty")
    limit = bundle.context_limit()
    if o.context is not None and not 16 <= o.context <= limit:
        raise DflashError(f"--context must be between 16 and {limit} (got {o.context})")
    context = o.context or limit
    if len(ids) >= context:
        raise DflashError(f"prompt is {len(ids)} tokens; the context holds {context}")
    params = bundle.sampling(o.temperature, o.top_p, o.top_k, o.seed)
    set_threads(o.threads, bundle, bundle.device)
    trace = _open_trace(o.trace)  # early: a bad path fails before the weights load
    guard = RepetitionGuard(o.repeat_guard)
    stop = StopTexts(tok, o.stop)
    try:
        decoder = make_decoder(bundle, o.draft, o.draft_len)
        if unused := unused_draft_len(decoder, o.draft_len):
            warn(unused)
        forced = tuning.KNOBS.force_tau
        if forced is not None and not hasattr(decoder, "proposer"):
            raise DflashError("DFLASH_FORCE_TAU forces a drafter's acceptance: it needs a drafter (not --draft none)")
        check_draft_len(decoder, o.draft_len)
        # A little room past max_tokens so the last speculative steps keep their full block (--context: no more).
        max_len = min(context, len(ids) + o.max_tokens + 32) if o.context is None else context
        session = Session(bundle.load_model(), max_len=max_len)
        clock.mark("weights")
        capture_graphs(session, decoder, params)
        clock.mark("graphs")
        if forced is not None:  # a benchmark's: the drafts are the target's greedy text (bench/forced.py)
            from ..bench.forced import forced_generate

            decoder = forced_generate(session, decoder, ids, o.max_tokens, forced)
            clock.mark("forced_pre_run")
        req = Request(prompt_ids=ids, params=params, max_tokens=o.max_tokens, stop_ids=tok.stop_ids)
        on_step = tee(guard.on_step, _tracer(trace), stop.check)
        if status is not None:
            status.stop()
        if o.json:
            result = generate(session, decoder, req, on_step=tee(stop.on_step, on_step))
        else:
            # On a terminal the prompt shows first, dimmed (a pipe gets only the answer: StreamView's plain mode)
            with StreamView(console, tok, tok.stop_ids, show_drafts=o.show_drafts,
                            echo=prompt_echo(text, continues), text=stop if o.stop else None) as view:
                result = generate(session, decoder, req, on_step=tee(stop.on_step, view.on_step, on_step))
                view.finish_reason = finish_reason(result, guard, stop)
    finally:
        if trace:
            trace.close()
    reason = finish_reason(result, guard, stop)
    if reason == "repetition" and console.is_terminal and not o.json:
        console.print("[stopped: the answer was repeating itself; --no-repeat-guard to allow it]", style="dim",
                      markup=False, highlight=False)
    stats = json_stats(result.stats())
    captures, capture_s = session.prepared
    stats.update(graph_captures_at_load=captures, graph_capture_at_load_s=round(capture_s, 3),
                 startup_s=clock.stages(result.first_token_unix_s))
    if forced is not None:
        stats.update(forced_tau=forced)  # not a drafter's acceptance: the greedy text forced into its drafts
    if o.json:
        tokens = result.tokens if stop.text is None else stop.text.tokens_through(result.tokens, stop.stop_ids)
        visible = [t for t in tokens if t not in set(tok.stop_ids)]
        print(json.dumps({
            "text": tok.decode(visible) if stop.text is None else stop.text.text,
            "tokens": tokens,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": len(tokens),  # as `generate --url --json`, which has no ids
            "finish_reason": reason,
            "stats": stats,
        }, ensure_ascii=False))
    if o.stats and not (console.is_terminal and not o.json):
        for line in footer_lines(len(result.tokens), result.ttft_s, result.decode_s, result.steps, 10_000, reason):
            print(line, file=sys.stderr)
    if result.interrupted and reason == "interrupted":
        raise KeyboardInterrupt


def _open_trace(path: Path | None):
    if path is None:
        return None
    try:
        return open(Path(path).expanduser(), "w", encoding="utf-8")
    except OSError as exc:
        raise DflashError(f"cannot write trace file {path}: {exc.strerror}") from None


def _tracer(trace):
    if trace is None:
        return None
    counter = iter(range(1 << 62))

    def write(step):
        trace.write(json.dumps({"step": next(counter), "draft": step.draft, "accepted": step.accepted,
                                "emitted": step.emitted}) + "\n")
        trace.flush()  # readable while the generation runs

    return write
