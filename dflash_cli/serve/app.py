"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions, /metrics.

Each response carries our speculative statistics in an extra `dflash` field (streaming: on the last chunk)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from ..errors import DflashError
from .engine_bridge import Engine, Job
from .metrics import Metrics
from .protocol import ApiError, GenParams, chat_messages, chat_think, completion_prompt, parse_common, parse_json
from .scheduler import Scheduler

POLL_S = 0.25  # how often a waiting handler checks that its client is still there
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the rest of the context


def create_app(engine: Engine, served_name: str, api_key: str | None = None, max_queue: int = 16) -> FastAPI:
    metrics = Metrics(served_name)
    sched = Scheduler(engine, metrics, max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        sched.close()

    app = FastAPI(title="dflash", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    names = {served_name, engine.entry.name, engine.entry.target.ref, engine.entry.target.name}
    created = int(time.time())
    app.state.engine, app.state.scheduler, app.state.metrics = engine, sched, metrics

    @app.exception_handler(ApiError)
    async def api_error(_request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(_request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(ApiError(exc.status_code, str(exc.detail), code=code).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(_request, exc: Exception):
        return JSONResponse(ApiError(500, f"{type(exc).__name__}: {exc}", code="internal_error").body(),
                            status_code=500)

    async def check_key(request: Request) -> None:
        if api_key:
            given = request.headers.get("authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else ""
            if not secrets.compare_digest(token.encode(), api_key.encode()):
                raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                               code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])
    app.state.stopping = lambda: False  # `dflash serve` points it at uvicorn's should_exit

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    card = {"id": served_name, "object": "model", "created": created, "owned_by": "dflash",
            "max_model_len": engine.context}

    @v1.get("/models")
    async def list_models():
        return {"object": "list", "data": [card]}

    @v1.get("/models/{model:path}")  # the client's models.retrieve; :path, as Hub ids hold a slash
    async def get_model(model: str):
        check_model(model)
        return card

    @app.get("/metrics")
    async def get_metrics():
        return PlainTextResponse(metrics.render(engine.draft_len), media_type="text/plain; version=0.0.4")

    def check_model(model: str | None) -> None:
        if model is not None and model not in names:
            raise ApiError(404, f"the model '{model}' does not exist; this server serves '{served_name}'",
                           param="model", code="model_not_found")

    def make_job(ids: list[int], p: GenParams, default_max: int | None) -> Job:
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt", code="invalid_value")
        vocab = engine.bundle.cfg.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, f"prompt token ids must be in [0, {vocab})", param="prompt", code="invalid_value")
        if len(ids) >= engine.context:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this server's context holds {engine.context} "
                                f"(the prompt must leave room for at least one new token)", param="prompt",
                           code="context_length_exceeded")
        try:
            params = engine.sampling(p.temperature, p.top_p, None if p.top_k is None else max(p.top_k, 0), p.seed)
        except DflashError as exc:
            raise ApiError(400, str(exc), code="invalid_value") from None
        max_tokens = p.max_tokens or default_max or engine.context - len(ids)
        return Job(prompt_ids=ids, max_tokens=max_tokens, params=params, stop=p.stop, ignore_eos=p.ignore_eos)

    @v1.post("/completions")
    async def completions(request: Request):
        body = parse_json(await request.body())
        p = parse_common(body)
        check_model(p.model)
        prompt = completion_prompt(body)
        ids = engine.encode(prompt) if isinstance(prompt, str) else prompt
        job = make_job(ids, p, COMPLETION_DEFAULT_MAX_TOKENS)
        return await respond(request, job, p, chat=False)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        body = parse_json(await request.body())
        p = parse_common(body, "max_completion_tokens")
        check_model(p.model)
        try:
            ids = engine.encode_chat(chat_messages(body), chat_think(body))
        except DflashError as exc:
            raise ApiError(400, str(exc), param="messages", code="invalid_value") from None
        job = make_job(ids, p, None)
        return await respond(request, job, p, chat=True)

    async def respond(request: Request, job: Job, p: GenParams, chat: bool):
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": served_name}
        if p.stream:
            return stream(request, job, p, chat, head)
        fut = sched.submit(job)
        while not fut.done():
            await asyncio.wait({fut}, timeout=POLL_S)
            if not fut.done() and (app.state.stopping() or await request.is_disconnected()):
                job.cancelled.set()
        out = fut.result()
        if out is None or out.finish_reason is None:
            err = (ApiError(503, "the server is shutting down", code="shutting_down") if app.state.stopping()
                   else ApiError(499, "the client closed the request", code="cancelled"))
            return JSONResponse(err.body(), err.status)
        choice = {"index": 0, "logprobs": None, "finish_reason": out.finish_reason}
        choice.update({"message": {"role": "assistant", "content": out.text}} if chat else {"text": out.text})
        if p.return_token_ids:  # vLLM's extension: the generated ids
            choice["token_ids"] = out.tokens
        return {**head, "choices": [choice], "usage": usage(out), "dflash": out.stats}

    def stream(request: Request, job: Job, p: GenParams, chat: bool, head: dict) -> StreamingResponse:
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        job.on_text = lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece)
        fut = sched.submit(job)  # before the response starts: a full queue is still a plain 503
        fut.add_done_callback(lambda _f: pieces.put_nowait(None))
        head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(piece: str | None, finish=None, **extra) -> str:
            if chat:
                delta = {} if piece is None else {"content": piece}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
            return sse({**head, "choices": [choice], **extra})

        async def events():
            try:
                if chat:
                    yield sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}]})
                while True:
                    if app.state.stopping():
                        return  # Ctrl-C on the server: the stream ends here, its job in `finally`
                    try:
                        piece = await asyncio.wait_for(pieces.get(), POLL_S)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            return  # (Starlette also ends a stream whose client left)
                        continue
                    if piece is None:
                        break
                    yield chunk(piece)
                try:
                    out = fut.result()
                except ApiError as exc:
                    yield sse(exc.body())
                    return
                except Exception as exc:
                    yield sse(ApiError(500, f"{type(exc).__name__}: {exc}", code="internal_error").body())
                    return
                if out is None or out.finish_reason is None:
                    return
                if p.include_usage:  # OpenAI's usage chunk, the only one with usage (clients add up every usage)
                    yield chunk(None, out.finish_reason, dflash=out.stats)
                    yield sse({**head, "choices": [], "usage": usage(out)})
                else:  # not asked for: our extension, on the last chunk
                    yield chunk(None, out.finish_reason, usage=usage(out), dflash=out.stats)
                yield "data: [DONE]\n\n"
            finally:
                job.cancelled.set()  # the client left (or we are done): stop generating for it

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    app.include_router(v1)
    return app


def usage(out) -> dict:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens}}


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
