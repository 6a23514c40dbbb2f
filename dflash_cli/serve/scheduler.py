"""Batch size 1: one worker thread runs the requests in turn; a bounded number may wait, the rest get 503."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from .engine_bridge import Engine, Job, Outcome
from .metrics import Metrics
from .protocol import ApiError


class Scheduler:
    def __init__(self, engine: Engine, metrics: Metrics, max_queue: int):
        self.engine, self.metrics, self.max_queue = engine, metrics, max_queue
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="dflash-generate")
        self.inflight = 0  # admitted and not finished; touched on the event loop only
        self.jobs: set[Job] = set()

    def submit(self, job: Job) -> asyncio.Future:
        """Queue a job (or refuse it with 503) and return the future of its Outcome. Call on the event loop."""
        if self.inflight >= 1 + self.max_queue:
            self.metrics.add("rejected")
            raise ApiError(503, f"the server is busy: {self.inflight - 1} requests already wait (--max-queue "
                                f"{self.max_queue}); retry later", code="queue_full", type_="server_busy")
        self.inflight += 1
        self.jobs.add(job)
        self.metrics.adjust("waiting", 1)
        fut = asyncio.get_running_loop().run_in_executor(self.pool, self._run, job)
        fut.add_done_callback(lambda _f: self._done(job))
        return fut

    def _done(self, job: Job) -> None:
        self.inflight -= 1
        self.jobs.discard(job)

    def _run(self, job: Job) -> Outcome | None:
        self.metrics.adjust("waiting", -1)
        if job.cancelled.is_set():  # the client left while it waited
            self.metrics.add("cancelled")
            return None
        self.metrics.adjust("running", 1)
        try:
            out = self.engine.run(job)
        finally:
            self.metrics.adjust("running", -1)
        self.metrics.record(out.steps, out.prompt_tokens, out.cached_tokens, out.completion_tokens, out.finish_reason)
        if out.finish_reason is None:
            self.metrics.add("cancelled")
        return out

    def close(self) -> None:
        """At shutdown: end the running generation and drop the waiting ones."""
        for job in list(self.jobs):
            job.cancelled.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
