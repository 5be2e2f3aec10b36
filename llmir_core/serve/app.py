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
import hmac
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from .generation import Generation, busy, shutting_down
from .model import ServedModel
from .prepare import prepare
from .scheduler import QueueFull, ShuttingDown
from .schemas import APIError
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


def create_app(
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
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    api = _Api(model, Workers(workers), max_body, playground or {})
    routes = [
        Route("/", api.index),
        Route("/v1/models", api.models),
        Route("/health", api.health),
        Route("/metrics", api.metrics),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/tokenize", api.tokenizer_route, methods=["POST"]),
        Route("/detokenize", api.tokenizer_route, methods=["POST"]),
        Route("/tokenizer_info", api.tokenizer_route),
        Route("/api/playground", api.info),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=_lifespan(model),
        exception_handlers={
            APIError: _api_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
    )
    return _Guard(app, model, api_key)


class _Api:
    """The route handlers of one served model."""

    def __init__(
        self, model: ServedModel, pool: Workers, max_body: int, playground: dict[str, Any]
    ) -> None:
        self.model = model
        self.sched = model.scheduler
        self.pool = pool
        self.max_body = max_body
        self.playground = playground
        # a template stops itself at its limit; this only catches a worker stuck past it
        self.timeout = 2 * model.template_timeout + 30.0
        self.generation = Generation(model, pool, self.timeout)

    async def models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        model = self.model
        card = {
            "id": model.name,
            "object": "model",
            "created": 0,
            "owned_by": "llmir",
            "max_model_len": model.max_context,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        closing = self.sched.closing
        return JSONResponse(
            {"status": "draining" if closing else "ok", "model": self.model.name}
            | self.sched.snapshot(),
            status_code=503 if closing else 200,
        )

    async def metrics(self, request: Any) -> Any:
        from starlette.responses import PlainTextResponse

        text = self.model.metrics.render()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def info(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        model = self.model
        return JSONResponse(
            {"model": model.name, "max_context": model.max_context, **self.playground}
        )

    async def index(self, request: Any) -> Any:
        from starlette.responses import FileResponse

        return FileResponse(STATIC_DIR / "index.html")

    async def completions(self, request: Any) -> Any:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Any) -> Any:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Any, chat: bool) -> Any:
        """Take a place in the queue, prepare the request on a worker thread, then generate."""
        sched, model = self.sched, self.model
        if sched.closing:
            raise shutting_down()
        raw = await read_body(request, self.max_body)
        try:
            ticket = sched.reserve()  # the parsing and tokenizing count against the queue
        except QueueFull as exc:
            raise busy(exc) from None
        except ShuttingDown:
            raise shutting_down() from None
        try:
            p, prompts = await self.pool.run(lambda: prepare(model, raw, chat), self.timeout)
            return await self.generation.start(request, p, prompts, chat, ticket)
        except JobTimeout:
            raise APIError(
                500,
                f"preparing the request took more than {self.timeout:g} s",
                type="server_error",
                code="internal_error",
            ) from None
        finally:
            ticket.release()  # a no-op once the request is queued

    async def tokenizer_route(self, request: Any) -> Any:
        """/tokenize, /detokenize (on a worker thread) and /tokenizer_info."""
        from starlette.responses import JSONResponse

        model = self.model
        path = request.url.path
        if path == "/tokenizer_info":
            return JSONResponse(tokenizer_info(model))
        raw = await read_body(request, self.max_body)
        job = tokenize if path == "/tokenize" else detokenize
        try:
            answer = await self.pool.run(lambda: job(model, raw), self.timeout)
        except JobTimeout:
            raise APIError(
                500,
                f"{path} took more than {self.timeout:g} s",
                type="server_error",
                code="internal_error",
            ) from None
        return JSONResponse(answer)


def _lifespan(model: ServedModel) -> Callable[[Any], Any]:
    """Start the scheduler with the app; on shutdown, let in-flight requests finish."""
    sched = model.scheduler

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        sched.start()
        try:
            yield
        finally:
            sched.close()  # in-flight requests finish (uvicorn waited for their responses)
            await asyncio.get_running_loop().run_in_executor(None, sched.join, 30.0)

    return lifespan


async def _api_error(request: Any, exc: Exception) -> Any:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _internal_error(request: Any, exc: Exception) -> Any:
    # the body of an unexpected failure is JSON too (starlette still logs the traceback)
    err = APIError(
        500, f"internal error: {type(exc).__name__}", type="server_error", code="internal_error"
    )
    return error_response(err)


async def _http_error(request: Any, exc: Exception) -> Any:
    """404 and 405 in OpenAI's error body (starlette raises them as HTTPException)."""
    from starlette.exceptions import HTTPException

    assert isinstance(exc, HTTPException)
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        err = APIError(404, f"unknown request URL: {method} {path}", code="unknown_url")
    elif exc.status_code == 405:
        err = APIError(405, f"method {method} is not allowed on {path}", code="method_not_allowed")
    else:
        err = APIError(exc.status_code, str(exc.detail))
    return error_response(err)


__all__ = ["create_app", "read_body", "MAX_BODY", "STATIC_DIR"]
