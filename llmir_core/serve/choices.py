"""`n` choices of one prompt: their seeds, their scheduler group, their answers.

A request with `n` > 1 gets n scheduler requests per prompt; the first prefills the prompt and
the others (its `group`) are forked from it (`llmir_core.serve.scheduler`). Choices are ordered
prompt-major, as OpenAI orders them: choice `index` = prompt_i * n + j. Choice j of a seeded
request samples with `sampling_params.choice_seed(seed, j)`: the request's own seed for j = 0 (so choice 0 is
what n=1 answers) and one derived from (seed, j) for the others, so a seed with n reproduces
every choice and the choices differ; without a seed each sampler seeds itself.

`stream_choices` is the event stream of n > 1 choices of one prompt: each chunk names its
choice's `index` (on chat the first chunk of each has the role), each choice ends with its
finish chunk, and one last chunk with no choices carries the usage (the prompt counted once).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from .scheduler import Completion, GenRequest
from .schemas import APIError, chunk_body, usage
from .tool_parse import ToolReader, call_deltas


def link_group(group: list[GenRequest]) -> GenRequest:
    """The first request of one prompt's choices, the others forked from its prefill."""
    lead = group[0]
    lead.group = group[1:]
    for r in lead.group:
        r.leader = lead
    return lead


def chat_choice(index: int, res: Completion) -> dict[str, Any]:
    """A chat completion's choice `index` (completion_body's shape for choice 0)."""
    return {
        "index": index,
        "message": {"role": "assistant", "content": res.text},
        "finish_reason": res.finish_reason,
        "logprobs": None,
    }


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _chunk(body: dict[str, Any], index: int) -> str:
    body["choices"][0]["index"] = index
    return _event(body)


async def stream_choices(
    rid: str,
    name: str,
    chat: bool,
    reqs: list[GenRequest],
    events: Any,  # asyncio.Queue of (kind, index, value), as generation's
    cancel: Callable[[GenRequest], None],
    logprobs_of: Callable[[GenRequest, int, int, int], dict[str, Any]] | None = None,
    readers: list[ToolReader] | None = None,
) -> AsyncIterator[str]:
    """The chunks of one prompt's choices `reqs` (index = position in reqs); logprobs_of(req,
    sent, upto, at): the `logprobs` of a completion chunk; readers: each chat choice's tool
    reader (text that may begin a call is held back; calls end the choice as deltas). The
    group is cancelled when the client goes away first."""
    created = int(time.time())
    sent = [0] * len(reqs)  # per choice: tokens whose log-probs went out, characters sent
    at = [0] * len(reqs)
    done: dict[int, Completion] = {}
    try:
        if chat:
            for k in range(len(reqs)):
                yield _chunk(chunk_body(rid, name, created, "", None, True, first=True), k)
        while len(done) < len(reqs):
            kind, k, value = await events.get()
            req = reqs[k]
            if kind == "text":
                piece, upto = value
                if readers is not None:
                    piece = readers[k].feed(piece)
                    if not piece:
                        continue
                lp = logprobs_of(req, sent[k], upto, at[k]) if logprobs_of else None
                sent[k], at[k] = upto, at[k] + len(piece)
                yield _chunk(chunk_body(rid, name, created, piece, None, chat, logprobs=lp), k)
                continue
            if not isinstance(value, Completion):
                yield _event(
                    APIError(500, f"generation failed: {value}", type="server_error").body()
                )
                yield "data: [DONE]\n\n"
                return
            done[k] = value
            why = value.finish_reason
            if readers is not None:
                bodies, called = tool_chunks(rid, name, created, readers[k])
                for body in bodies:
                    yield _chunk(body, k)
                why = "tool_calls" if called else why
            lp = logprobs_of(req, sent[k], len(req.gen_lp), at[k]) if logprobs_of else None
            if chat and lp is not None and not lp.get("content"):
                lp = None  # no content token left (an end token has no chat entry)
            body = chunk_body(rid, name, created, None, why, chat, logprobs=lp)
            yield _chunk(body, k)
        tokens = sum(len(c.token_ids) for c in done.values())
        last = chunk_body(
            rid, name, created, None, None, chat, usage(done[0].prompt_tokens, tokens)
        )
        last["choices"] = []
        yield _event(last)
        yield "data: [DONE]\n\n"
    finally:
        if len(done) < len(reqs):
            cancel(reqs[0])  # the whole group


def tool_chunks(
    rid: str, name: str, created: int, reader: ToolReader
) -> tuple[list[dict[str, Any]], bool]:
    """The chunks that end a chat stream read for tool calls: the held-back content, then the
    calls' deltas (none when the answer held no call); and whether there were calls."""
    rest, calls = reader.finish()
    out = [chunk_body(rid, name, created, rest, None, True)] if rest else []
    for delta in call_deltas(calls):
        body = chunk_body(rid, name, created, None, None, True)
        body["choices"][0]["delta"] = delta
        out.append(body)
    return out, bool(calls)


__all__ = ["chat_choice", "link_group", "stream_choices", "tool_chunks"]
