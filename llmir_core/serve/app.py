"""The HTTP side of `llmir serve`: an OpenAI-compatible API on starlette (imported lazily).

Routes: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (JSON, or
server-sent events with `stream: true`, the last chunk carrying `usage`; completions take
several prompts, one choice each, and `logprobs` / `echo`: see `schemas`), vLLM's tokenizer
endpoints `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info` (`tokenize`), `GET /health`,
`GET /metrics` (Prometheus text), and the Playground: `GET /` with its static files and
`GET /api/playground` (the artifact's IR, report, pass diffs and bench results).

Errors have OpenAI's body, `{"error": {"message", "type", "param", "code"}}`: 400 bad JSON or
parameter values, prompts over the context and chat templates that fail, 401 a missing or wrong
API key (compared in constant time; `/v1/*`, `/api/*` and the tokenizer endpoints only), 404
unknown model or route, 405 wrong method, 413 oversize body, 429 full queue (with
`Retry-After`), 500 an internal error, 503 while shutting down. A client that disconnects
cancels its request, and its KV slot is freed at the next scheduler step.

The event loop only moves bytes: a generation request takes its place in the queue first
(429 when there is none), then its body is parsed, its chat template rendered and its prompt
tokenized on worker threads (`workers`, `prepare`), bounded before the work starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from llmir_core.runtime.sampling import Sampler, SamplingConfig

from .logprobs import legacy_logprobs
from .model import ServedModel
from .prepare import prepare
from .scheduler import Completion, GenRequest, QueueFull, ShuttingDown, Ticket
from .schemas import APIError, GenParams, chunk_body, completion_body, new_id, usage
from .tokenize import detokenize, tokenize, tokenizer_info
from .workers import JobTimeout, Workers

STATIC_DIR = Path(__file__).parent / "static"
TOKENIZER_ROUTES = ("/tokenize", "/detokenize", "/tokenizer_info")
MAX_BODY = 1 << 20  # bytes
ROUTES = (
    "/",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
    "/health",
    "/metrics",
    "/api/playground",
)


def error_response(err: APIError) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body: 413 past `limit` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    too_big = APIError(
        413, f"the request body exceeds the limit of {limit} bytes", code="request_too_large"
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _busy(exc: Exception) -> APIError:
    return APIError(
        429,
        f"the server is busy: {exc}",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": "1"},
    )


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", type="server_error", code="shutting_down")


class _Guard:
    """Pure ASGI middleware: API key check and request counting by route and status."""

    def __init__(self, app: Any, model: ServedModel, api_key: str | None) -> None:
        self.app = app
        self.model = model
        self.key = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in ROUTES else ("/static" if path.startswith("/static/") else "other")
        status = 500

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            guarded = path.startswith(("/v1/", "/api/")) or path in TOKENIZER_ROUTES
            if self.key is not None and guarded:
                given = dict(scope["headers"]).get(b"authorization", b"")
                if not hmac.compare_digest(given, self.key):
                    err = APIError(
                        401,
                        "incorrect API key provided"
                        if given
                        else "you didn't provide an API key (Authorization: Bearer KEY)",
                        code="invalid_api_key",
                    )
                    await error_response(err)(scope, receive, counting_send)
                    return
            await self.app(scope, receive, counting_send)
        finally:
            self.model.metrics.request(route, status)


def create_app(  # noqa: C901 (one nested handler per route)
    model: ServedModel,
    *,
    api_key: str | None = None,
    max_body: int = MAX_BODY,
    playground: dict[str, Any] | None = None,
    workers: int = 4,
) -> Any:
    """The ASGI application; its lifespan starts the scheduler and drains it on shutdown.
    `workers`: threads that parse, render and tokenize requests."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import (
        FileResponse,
        JSONResponse,
        PlainTextResponse,
        Response,
        StreamingResponse,
    )
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    sched = model.scheduler
    pool = Workers(workers)
    # a template stops itself at its limit; this only catches a worker stuck past it
    prepare_timeout = 2 * model.template_timeout + 30.0

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": model.name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "llmir",
                        "max_model_len": model.max_context,
                    }
                ],
            }
        )

    async def health(request: Request) -> Response:
        status = "draining" if sched.closing else "ok"
        return JSONResponse(
            {"status": status, "model": model.name, **sched.snapshot()},
            status_code=503 if sched.closing else 200,
        )

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(model.metrics.render(), media_type="text/plain; version=0.0.4")

    async def info(request: Request) -> Response:
        return JSONResponse(
            {"model": model.name, "max_context": model.max_context, **(playground or {})}
        )

    async def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html")

    async def generate(request: Request, chat: bool) -> Response:
        if sched.closing:
            raise _shutting_down()
        raw = await read_body(request, max_body)
        try:
            ticket = sched.reserve()  # the parsing and tokenizing count against the queue
        except QueueFull as exc:
            raise _busy(exc) from None
        except ShuttingDown:
            raise _shutting_down() from None
        try:
            p, prompts = await pool.run(lambda: prepare(model, raw, chat), prepare_timeout)
            return await _start(request, p, prompts, chat, ticket)
        except JobTimeout:
            raise APIError(
                500,
                f"preparing the request took more than {prepare_timeout:g} s",
                type="server_error",
                code="internal_error",
            ) from None
        finally:
            ticket.release()  # a no-op once the request is queued

    async def _start(
        request: Request, p: GenParams, prompts: list[list[int]], chat: bool, ticket: Ticket
    ) -> Response:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()

        def put(kind: str, index: int, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, (kind, index, value))

        room = sched.decoder.slots + sched.max_queue
        if len(prompts) > room:  # it could never be admitted whole: not a 429 to retry
            raise APIError(
                400,
                f"{len(prompts)} prompts in one request, but the server holds at most {room} "
                "(--max-batch + --max-queue): send fewer at once",
                param="prompt",
                code="invalid_value",
            )
        reqs: list[GenRequest] = []
        for i, ids in enumerate(prompts):
            wanted = model.max_context if p.max_tokens is None else p.max_tokens
            sampler = Sampler(SamplingConfig(temperature=p.temperature, top_p=p.top_p, seed=p.seed))
            req = GenRequest(
                ids,
                min(wanted, model.max_context - len(ids)),
                sampler,
                functools.partial(put, "text", i),
                functools.partial(put, "done", i),
                stop=p.stop,
                eos_ids=model.eos_ids,
                logprobs=p.logprobs,
                echo_logprobs=p.echo and p.logprobs is not None,
            )
            # a text event carries how many tokens have log-probs by then (a stream sends them)
            req.on_text = functools.partial(_text_event, put, i, req)
            try:
                sched.submit(req, ticket if i == 0 else None)
            except (QueueFull, ShuttingDown) as exc:
                for r in reqs:
                    sched.cancel(r)
                if isinstance(exc, ShuttingDown):
                    raise _shutting_down() from None
                raise _busy(exc) from None
            reqs.append(req)
        rid = new_id("chatcmpl" if chat else "cmpl")
        if p.stream:  # one prompt (schemas refuses stream with several)
            return StreamingResponse(
                _sse(rid, p.model, chat, reqs[0], events, p.logprobs is not None),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        results = await _whole(request, reqs, events)
        if results is None:
            return Response(status_code=499)
        use = usage(sum(r.prompt_tokens for r in results), sum(len(r.token_ids) for r in results))
        if chat or (len(results) == 1 and not p.echo and p.logprobs is None):
            res = results[0]
            return JSONResponse(
                completion_body(rid, p.model, res.text, res.finish_reason, use, chat)
            )
        choices = await pool.run(lambda: _choices(p, prompts, results), prepare_timeout)
        return JSONResponse(completion_body(rid, p.model, "", "", use, False, choices))

    def _choices(
        p: GenParams, prompts: list[list[int]], results: list[Completion]
    ) -> list[dict[str, Any]]:
        """A completion's choices with the prompt echoed and log-probs when asked."""
        out = []
        for i, (ids, res) in enumerate(zip(prompts, results)):
            given = p.prompts[i] if i < len(p.prompts) else None
            echoed = (given if isinstance(given, str) else model.decode(ids)) if p.echo else ""
            lp = None
            if p.logprobs is not None:
                lp = legacy_logprobs(
                    model.decode_special,
                    model.special_ids,
                    ids,
                    res.prompt_logprobs,
                    res.logprobs or [],
                    len(echoed) if p.echo else None,
                )
            out.append(
                {
                    "index": i,
                    "text": echoed + res.text,
                    "finish_reason": res.finish_reason,
                    "logprobs": lp,
                }
            )
        return out

    async def _whole(
        request: Request, reqs: list[GenRequest], events: asyncio.Queue[tuple[str, int, Any]]
    ) -> list[Completion] | None:
        """Every request's completion (None: the client went away; the requests are cancelled)."""
        results: dict[int, Any] = {}

        async def done() -> None:
            while len(results) < len(reqs):
                kind, index, value = await events.get()
                if kind == "done":
                    results[index] = value

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        waiter, watcher = asyncio.ensure_future(done()), asyncio.ensure_future(gone())
        try:
            await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not waiter.done():
                waiter.cancel()
                for r in reqs:
                    sched.cancel(r)
        if waiter.cancelled():
            return None
        failed = next((v for v in results.values() if not isinstance(v, Completion)), None)
        if failed is not None:
            raise APIError(
                500, f"generation failed: {failed}", type="server_error", code="internal_error"
            )
        return [results[i] for i in range(len(reqs))]

    def _chunk_logprobs(req: GenRequest, sent: int, upto: int, at: int) -> dict[str, Any]:
        """The `logprobs` of generated tokens [sent, upto) of a stream, offsets from `at`."""
        context = [*req.prompt_ids, *(e.token for e in req.gen_lp[:sent])]
        lp = legacy_logprobs(
            model.decode_special, model.special_ids, context, None, req.gen_lp[sent:upto]
        )
        lp["text_offset"] = [at + o for o in lp["text_offset"]]
        return lp

    async def _sse(
        rid: str,
        name: str,
        chat: bool,
        req: GenRequest,
        events: asyncio.Queue[tuple[str, int, Any]],
        logprobs: bool = False,
    ) -> AsyncIterator[str]:
        created = int(time.time())
        finished = False
        sent = at = 0  # tokens whose log-probs went out; characters of text sent
        try:
            if chat:
                yield _event(chunk_body(rid, name, created, "", None, True, first=True))
            while True:
                kind, _, value = await events.get()
                if kind == "text":
                    piece, upto = value
                    lp = _chunk_logprobs(req, sent, upto, at) if logprobs else None
                    sent, at = upto, at + len(piece)
                    yield _event(chunk_body(rid, name, created, piece, None, chat, logprobs=lp))
                    continue
                finished = True
                if isinstance(value, Completion):
                    use = usage(value.prompt_tokens, len(value.token_ids))
                    lp = None
                    if logprobs:  # an end-of-sequence token's, or none
                        lp = _chunk_logprobs(req, sent, len(req.gen_lp), at)
                    yield _event(
                        chunk_body(
                            rid, name, created, None, value.finish_reason, chat, use, logprobs=lp
                        )
                    )
                else:
                    yield _event(
                        APIError(500, f"generation failed: {value}", type="server_error").body()
                    )
                yield "data: [DONE]\n\n"
                return
        finally:
            if not finished:
                sched.cancel(req)

    async def tokenizer_route(request: Request) -> Response:
        """/tokenize, /detokenize (on a worker thread) and /tokenizer_info."""
        path = request.url.path
        if path == "/tokenizer_info":
            return JSONResponse(tokenizer_info(model))
        raw = await read_body(request, max_body)
        job = tokenize if path == "/tokenize" else detokenize
        try:
            answer = await pool.run(lambda: job(model, raw), prepare_timeout)
        except JobTimeout:
            raise APIError(
                500,
                f"{path} took more than {prepare_timeout:g} s",
                type="server_error",
                code="internal_error",
            ) from None
        return JSONResponse(answer)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        response: Response = error_response(exc)
        return response

    async def internal_error(request: Request, exc: Exception) -> Response:
        # the body of an unexpected failure is JSON too (starlette still logs the traceback)
        response: Response = error_response(
            APIError(
                500,
                f"internal error: {type(exc).__name__}",
                type="server_error",
                code="internal_error",
            )
        )
        return response

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            err = APIError(
                404, f"unknown request URL: {request.method} {request.url.path}", code="unknown_url"
            )
        elif exc.status_code == 405:
            err = APIError(
                405,
                f"method {request.method} is not allowed on {request.url.path}",
                code="method_not_allowed",
            )
        else:
            err = APIError(exc.status_code, str(exc.detail))
        response: Response = error_response(err)
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        sched.start()
        try:
            yield
        finally:
            sched.close()  # in-flight requests finish (uvicorn waited for their responses)
            await asyncio.get_running_loop().run_in_executor(None, sched.join, 30.0)

    routes = [
        Route("/", index),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/tokenize", tokenizer_route, methods=["POST"]),
        Route("/detokenize", tokenizer_route, methods=["POST"]),
        Route("/tokenizer_info", tokenizer_route),
        Route("/api/playground", info),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            APIError: api_error,
            HTTPException: http_error,
            Exception: internal_error,
        },
    )
    return _Guard(app, model, api_key)


def _text_event(put: Any, index: int, req: GenRequest, piece: str) -> None:
    """A request's text callback (on the scheduler thread, right after the token's log-probs
    are recorded): the piece and how many generated tokens have log-probs so far."""
    put("text", index, (piece, len(req.gen_lp)))


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


__all__ = ["create_app", "read_body", "MAX_BODY", "STATIC_DIR"]
