"""Server counters in the Prometheus text format, named like vLLM's so the same dashboards and clients read them.

vLLM's names (docs: design/metrics.md, vllm/v1/spec_decode/metrics.py): spec_decode_num_drafts,
spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens, spec_decode_num_accepted_tokens_per_pos
(label `position`), prompt_tokens, generation_tokens, request_success (label `finished_reason`), all counters
exposed with `_total`, and the gauges num_requests_running / num_requests_waiting. Our own additions use `dflash:`.
"""

from __future__ import annotations

import threading
from collections import Counter


class Metrics:
    def __init__(self, model_name: str):
        self.model = model_name
        self._lock = threading.Lock()
        self.counts: Counter = Counter()
        self.per_pos: Counter = Counter()
        self.finished: Counter = Counter()
        self.running = 0
        self.waiting = 0

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def adjust(self, gauge: str, delta: int) -> None:
        """running / waiting, changed from the event loop and the worker thread."""
        with self._lock:
            setattr(self, gauge, getattr(self, gauge) + delta)

    def record(self, steps, prompt_tokens: int, cached_tokens: int, generated: int, finish: str | None) -> None:
        """One request's outcome; steps: the decoder steps after the first token (engine Step objects)."""
        with self._lock:
            c = self.counts
            c["prompt_tokens"] += prompt_tokens
            c["cached_tokens"] += cached_tokens
            c["generation_tokens"] += generated
            for s in steps:
                if not s.draft:
                    continue
                c["drafts"] += 1
                c["draft_tokens"] += len(s.draft)
                c["accepted_tokens"] += s.accepted
                for i in range(s.accepted):
                    self.per_pos[i] += 1
            if finish is not None:
                self.finished[finish] += 1

    def render(self, draft_len: int) -> str:
        m = f'model_name="{_escape(self.model)}"'
        with self._lock:
            c, per_pos, finished = dict(self.counts), dict(self.per_pos), dict(self.finished)
            running, waiting = self.running, self.waiting
        lines: list[str] = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{{{m}{labels}}} {float(value)}")

        metric("vllm:num_requests_running", "gauge", "Requests generating now (0 or 1: batch size 1).",
               [("", running)])
        metric("vllm:num_requests_waiting", "gauge", "Requests queued behind the running one.", [("", waiting)])
        metric("vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               [("", c.get("prompt_tokens", 0))])
        metric("vllm:generation_tokens_total", "counter", "Generated tokens.", [("", c.get("generation_tokens", 0))])
        metric("vllm:request_success_total", "counter", "Finished requests by finish reason.",
               [(f',finished_reason="{r}"', finished.get(r, 0)) for r in sorted({"stop", "length", *finished})])
        metric("vllm:spec_decode_num_drafts_total", "counter", "Speculative steps that proposed drafts.",
               [("", c.get("drafts", 0))])
        metric("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.",
               [("", c.get("draft_tokens", 0))])
        metric("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
               [("", c.get("accepted_tokens", 0))])
        width = max([draft_len, *(p + 1 for p in per_pos)])
        metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted drafts by position.",
               [(f',position="{i}"', per_pos.get(i, 0)) for i in range(width)])
        metric("dflash:prefix_cached_tokens_total", "counter", "Prompt tokens found in the KV cache (not prefilled).",
               [("", c.get("cached_tokens", 0))])
        metric("dflash:requests_cancelled_total", "counter", "Requests whose client left before the end.",
               [("", c.get("cancelled", 0))])
        metric("dflash:requests_rejected_total", "counter", "Requests refused with 503: the queue was full.",
               [("", c.get("rejected", 0))])
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
