"""The generation half of the HTTP API: a prepared completion request becomes scheduler requests,
answered whole (JSON) or as server-sent events.

`Generation.start` takes the parsed parameters and tokenized prompts (see `prepare`) with the
queue ticket the request holds, submits one `GenRequest` per prompt (n per prompt with `n` > 1:
one prefill, forked; `choices`), and answers: a stream for `stream: true` (one prompt), else
the completions once every request is done. The scheduler thread reports through `put`, which
hands events to the event loop; a client that goes away cancels its requests. starlette is imported lazily, like in `app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from llmir_core.runtime.sampling import Sampler

from . import structured, tool_grammar
from .choices import chat_choice, link_group, stream_choices, tool_chunks
from .logprobs import chat_logprobs, legacy_logprobs
from .model import ServedModel
from .sampling_params import sampling_config
from .scheduler import Completion, GenRequest, QueueFull, ShuttingDown, Ticket
from .schemas import APIError, GenParams, chunk_body, completion_body, new_id, usage
from .tool_parse import ToolReader
from .tools import finish_choice, reader_for
from .workers import Workers

Events = asyncio.Queue[tuple[str, int, Any]]  # (kind: "text" | "done", choice index, value)
Put = Callable[[str, int, Any], None]


def busy(exc: Exception) -> APIError:
    """429: the queue is full (retry after a second)."""
    return APIError(
        429,
        f"the server is busy: {exc}",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": "1"},
    )


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", type="server_error", code="shutting_down")


class Generation:
    """Runs prepared completion requests on the model's scheduler and answers them."""

    def __init__(self, model: ServedModel, pool: Workers, timeout: float) -> None:
        self.model = model
        self.sched = model.scheduler
        self.pool = pool
        self.timeout = timeout  # for the work done on `pool` (building log-prob choices)

    async def start(
        self, request: Any, p: GenParams, prompts: list[list[int]], chat: bool, ticket: Ticket
    ) -> Any:
        """Submit one request per prompt (the first takes `ticket`'s place), then answer."""
        from starlette.responses import Response, StreamingResponse

        loop = asyncio.get_running_loop()
        events: Events = asyncio.Queue()

        def put(kind: str, index: int, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, (kind, index, value))

        template = self.model.tokenizer.chat_template
        reader = reader_for(p, template) if chat else None
        if p.grammar is not None:  # compiled off the event loop (a tokenizer's first: seconds)
            await self.pool.run(lambda: structured.compile_for(self.model, p.grammar), self.timeout)
        if reader is not None and not reader.forced and tool_grammar.wanted(p):
            p.grammar = tool_grammar.auto_grammar(p, reader.fmt, self.model.tokenizer)
            await self.pool.run(lambda: structured.compile_for(self.model, p.grammar), self.timeout)
        reqs = self._submit(p, prompts, ticket, put)
        rid = new_id("chatcmpl" if chat else "cmpl")
        if p.stream and p.n > 1:  # one prompt's choices
            lp_of = (
                functools.partial(self._chunk_logprobs, chat=chat)
                if p.logprobs is not None
                else None
            )
            readers = None if reader is None else [copy.copy(reader) for _ in reqs]  # unused
            return StreamingResponse(
                stream_choices(
                    rid,
                    p.model,
                    chat,
                    reqs,
                    events,
                    self.sched.cancel,
                    lp_of,
                    readers,
                ),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        if p.stream:  # one prompt (schemas refuses stream with several)
            return StreamingResponse(
                self._sse(rid, p.model, chat, reqs[0], events, p.logprobs is not None, reader),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        results = await self._whole(request, reqs, events)
        if results is None:
            return Response(status_code=499)
        return await self._answer(p, prompts, chat, rid, results, reader)

    def _submit(
        self, p: GenParams, prompts: list[list[int]], ticket: Ticket, put: Put
    ) -> list[GenRequest]:
        """One scheduler request per prompt and choice (choice index = prompt index x n +
        choice), all or none: a refusal cancels those submitted."""
        model, sched = self.model, self.sched
        if p.n > sched.decoder.slots:  # its choices could never run together
            raise APIError(
                400,
                f"n={p.n} choices, but the server runs at most {sched.decoder.slots} sequences "
                "at once (--max-batch)",
                param="n",
                code="invalid_value",
            )
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
        for k in range(len(prompts) * p.n):  # choice k: prompt i's choice j
            i, j = divmod(k, p.n)
            ids = prompts[i]
            wanted = model.max_context if p.max_tokens is None else p.max_tokens
            sampler = Sampler(sampling_config(p, j))
            req = GenRequest(
                ids,
                min(wanted, model.max_context - len(ids)),
                sampler,
                functools.partial(put, "text", k),
                functools.partial(put, "done", k),
                stop=p.stop,
                eos_ids=model.eos_ids,
                logprobs=p.logprobs,
                echo_logprobs=p.echo and p.logprobs is not None,
            )
            # a text event carries how many tokens have log-probs by then (a stream sends them)
            req.on_text = functools.partial(_text_event, put, k, req)
            req.constraint = structured.constraint(model, p.grammar)  # compiled by start()
            reqs.append(req)
            if j < p.n - 1:
                continue  # a prompt's choices go in together: one prefill, forked
            try:
                sched.submit(link_group(reqs[-p.n :]), ticket if i == 0 else None)
            except (QueueFull, ShuttingDown) as exc:
                for r in reqs:
                    sched.cancel(r)
                if isinstance(exc, ShuttingDown):
                    raise shutting_down() from None
                raise busy(exc) from None
        return reqs

    async def _answer(
        self,
        p: GenParams,
        prompts: list[list[int]],
        chat: bool,
        rid: str,
        results: list[Completion],
        reader: ToolReader | None = None,
    ) -> Any:
        """The JSON body of finished completions: one choice, or one per prompt with echo and
        log-probs (built on a worker thread)."""
        from starlette.responses import JSONResponse

        prompt_tokens = sum(r.prompt_tokens for r in results[:: p.n])  # once per prompt
        use = usage(prompt_tokens, sum(len(r.token_ids) for r in results))
        if chat and len(results) > 1:  # n choices
            choices = [chat_choice(k, r) for k, r in enumerate(results)]
            if p.logprobs is not None:  # each choice's content tokens (an end token's not)
                for choice, r in zip(choices, results):
                    gen = (r.logprobs or [])[: len(r.token_ids)]
                    choice["logprobs"] = chat_logprobs(self.model.decode_special, prompts[0], gen)
            for choice in choices:  # each choice's text read for tool calls on its own
                each = reader_for(p, self.model.tokenizer.chat_template)
                if each is not None:
                    finish_choice(choice, each)
            return JSONResponse(completion_body(rid, p.model, "", "", use, True, choices))
        if chat or (len(results) == 1 and not p.echo and p.logprobs is None):
            res = results[0]
            lp = None
            if chat and p.logprobs is not None:  # the content's tokens (an end token's not)
                gen = (res.logprobs or [])[: len(res.token_ids)]
                lp = await self.pool.run(
                    lambda: chat_logprobs(self.model.decode_special, prompts[0], gen),
                    self.timeout,
                )
            body = completion_body(
                rid, p.model, res.text, res.finish_reason, use, chat, logprobs=lp
            )
            if reader is not None:
                finish_choice(body["choices"][0], reader)
            return JSONResponse(body)
        choices = await self.pool.run(lambda: self._choices(p, prompts, results), self.timeout)
        return JSONResponse(completion_body(rid, p.model, "", "", use, False, choices))

    def _choices(
        self, p: GenParams, prompts: list[list[int]], results: list[Completion]
    ) -> list[dict[str, Any]]:
        """A completion's choices with the prompt echoed and log-probs when asked."""
        model = self.model
        out = []
        for k, res in enumerate(results):
            i = k // p.n  # the prompt of choice k
            ids = prompts[i]
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
                    "index": k,
                    "text": echoed + res.text,
                    "finish_reason": res.finish_reason,
                    "logprobs": lp,
                }
            )
        return out

    async def _whole(
        self, request: Any, reqs: list[GenRequest], events: Events
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
                    self.sched.cancel(r)
        if waiter.cancelled():
            return None
        failed = next((v for v in results.values() if not isinstance(v, Completion)), None)
        if failed is not None:
            raise APIError(
                500, f"generation failed: {failed}", type="server_error", code="internal_error"
            )
        return [results[i] for i in range(len(reqs))]

    def _chunk_logprobs(
        self, req: GenRequest, sent: int, upto: int, at: int, chat: bool = False
    ) -> dict[str, Any]:
        """The `logprobs` of generated tokens [sent, upto) of a stream, offsets from `at`
        (chat: its shape, without an end token's entry)."""
        model = self.model
        context = [*req.prompt_ids, *(e.token for e in req.gen_lp[:sent])]
        if chat:
            upto = max(sent, min(upto, len(req.ids)))  # req.ids never holds an end token
            return chat_logprobs(model.decode_special, context, req.gen_lp[sent:upto])
        lp = legacy_logprobs(
            model.decode_special, model.special_ids, context, None, req.gen_lp[sent:upto]
        )
        lp["text_offset"] = [at + o for o in lp["text_offset"]]
        return lp

    async def _sse(
        self,
        rid: str,
        name: str,
        chat: bool,
        req: GenRequest,
        events: Events,
        logprobs: bool = False,
        reader: ToolReader | None = None,
    ) -> AsyncIterator[str]:
        """The event stream of one request; it is cancelled when the client goes away first."""
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
                    if reader is not None:  # text that may begin a tool call is held back
                        piece = reader.feed(piece)
                        if not piece:
                            continue
                    lp = self._chunk_logprobs(req, sent, upto, at, chat) if logprobs else None
                    sent, at = upto, at + len(piece)
                    yield _event(chunk_body(rid, name, created, piece, None, chat, logprobs=lp))
                    continue
                finished = True
                if isinstance(value, Completion):
                    use = usage(value.prompt_tokens, len(value.token_ids))
                    why = value.finish_reason
                    if reader is not None:
                        bodies, called = tool_chunks(rid, name, created, reader)
                        for body in bodies:
                            yield _event(body)
                        why = "tool_calls" if called else why
                    lp = None
                    if logprobs:  # an end-of-sequence token's, or none
                        lp = self._chunk_logprobs(req, sent, len(req.gen_lp), at, chat)
                        lp = None if chat and not lp["content"] else lp
                    yield _event(chunk_body(rid, name, created, None, why, chat, use, logprobs=lp))
                else:
                    yield _event(
                        APIError(500, f"generation failed: {value}", type="server_error").body()
                    )
                yield "data: [DONE]\n\n"
                return
        finally:
            if not finished:
                self.sched.cancel(req)


def _text_event(put: Put, index: int, req: GenRequest, piece: str) -> None:
    """A request's text callback (on the scheduler thread, right after the token's log-probs
    are recorded): the piece and how many generated tokens have log-probs so far."""
    put("text", index, (piece, len(req.gen_lp)))


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
