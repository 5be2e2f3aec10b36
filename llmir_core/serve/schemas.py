"""The OpenAI request and response bodies the server speaks, checked by hand (no pydantic).

`parse_completion(body)` and `parse_chat(body)` turn a decoded JSON body into a `GenParams` or
raise `APIError` with the status code, error type, offending parameter and code that OpenAI's
API uses for the same mistake. Defaults follow OpenAI's: temperature 1, top_p 1, n 1; `max_tokens`
16 for completions and the rest of the context for chat.

Completions also take OpenAI's legacy scoring parameters: `prompt` as a string, a list of token
ids, or a list of either (one choice per prompt), `logprobs` (0..`MAX_LOGPROBS` alternatives per
token) and `echo` (the prompt comes back in the text, with its tokens' log-probabilities when
`logprobs` is set; `max_tokens` 0 is allowed then); a stream's chunks carry their tokens'
log-probs. Chat takes `logprobs: true` with `top_logprobs` (0..`MAX_LOGPROBS`).

Sampling beyond temperature / top_p (llmir_core/serve/sampling_params.py builds the sampler):
`logit_bias` (token id strings -> [-100, 100]), `presence_penalty` and `frequency_penalty`
([-2, 2]), and the extras vLLM and llama.cpp take: `top_k` (0 or -1: off), `min_p` ([0, 1]),
`repetition_penalty` (> 0).

Every field is honored or refused, never silently ignored: `llmir_core.serve.params` (the field
walk) refuses unknown fields and the fields the server does not act on before these parsers run
(docs/serve-api.md lists them); here `stream` with `echo` or several prompts is refused.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from llmir_core.runtime.grammar_spec import GrammarSpec

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (vLLM's default cap)
MAX_N = 128  # choices per prompt (OpenAI's bound)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class GenParams:
    model: str
    prompts: list[str | list[int]] = field(default_factory=list)  # completions: text or ids
    messages: list[dict[str, Any]] | None = None  # chat: role, content (+ tool use: see tools)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    logprobs: int | None = None  # completions: alternatives per token (None: no log-probs)
    echo: bool = False  # completions: the prompt comes back (with log-probs if asked)
    n: int = 1  # choices per prompt (one prefill shared by the n sequences)
    # sampling beyond temperature / top_p (llmir_core.runtime.sampling.SamplingConfig)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int | None = None  # chat: alternatives per token when `chat_logprobs`
    chat_logprobs: bool = False  # chat: `logprobs: true`
    grammar: GrammarSpec | None = None  # response_format or a forced tool choice
    tools: list[dict[str, Any]] | None = None  # chat: the functions the model may call
    tool_choice: str | dict[str, Any] | None = None  # none | auto | required | a named function
    parallel_tool_calls: bool = True


def _number(
    body: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool = False
) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise bad(name, f"'{name}' must be a number, got {v!r}", "invalid_type")
    if v < low or v > high or (low_open and v == low):
        span = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise bad(name, f"'{name}' must be in {span}, got {v}")
    return float(v)


def _int(body: dict[str, Any], name: str, low: int, high: int = 2**63 - 1) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"'{name}' must be an integer, got {v!r:.40}", "invalid_type")
    if v < low:
        raise bad(name, f"'{name}' must be >= {low}, got {v}")
    if v > high:
        raise bad(name, f"'{name}' must be <= {high}, got {v}")
    return v


def _common(body: Any) -> GenParams:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "you must provide a model parameter", "missing_required_parameter")
    p = GenParams(model=model)
    p.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    p.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    p.seed = _int(body, "seed", -(2**63), 2**64 - 1)
    if p.seed is not None and p.seed < 0:
        p.seed = p.seed % 2**64  # numpy seeds are non-negative; OpenAI takes any int64
    p.n = _int(body, "n", 1, MAX_N) or 1
    mt = _int(body, "max_completion_tokens", 1)
    p.max_tokens = _int(body, "max_tokens", 0) if mt is None else mt
    stop = body.get("stop")
    if isinstance(stop, str):
        p.stop = (stop,)
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        p.stop = tuple(stop)
    elif stop is not None:
        raise bad("stop", "'stop' must be a string or a list of at most 4 strings", "invalid_type")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad("stream", f"'stream' must be a boolean, got {stream!r}", "invalid_type")
    p.stream = bool(stream)
    _sampling(body, p)

    from .structured import response_format  # (it imports this module)

    p.grammar = response_format(body)
    return p


def _sampling(body: dict[str, Any], p: GenParams) -> None:
    """The sampling parameters beyond temperature / top_p (the module docstring's ranges)."""
    top_k = _int(body, "top_k", -1)
    p.top_k = 0 if top_k is None or top_k == -1 else top_k
    p.min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
    p.repetition_penalty = _number(body, "repetition_penalty", 1.0, 0.0, math.inf, low_open=True)
    p.presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    p.frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    bias = body.get("logit_bias")
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise bad(
            "logit_bias", "'logit_bias' must be a map of token ids to numbers", "invalid_type"
        )
    for key, v in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 20):
            raise bad("logit_bias", f"'logit_bias' keys must be token ids, got {key!r:.40}")
        if isinstance(v, bool) or not isinstance(v, int | float) or not -100 <= v <= 100:
            raise bad("logit_bias", f"'logit_bias' values must be in [-100, 100], got {v!r:.40}")
        p.logit_bias[int(key)] = float(v)


def _prompts(prompt: Any) -> list[str | list[int]]:
    """`prompt` as a list of prompts: a string, a list of token ids, or a list of either."""
    expected = "'prompt' must be a string, a list of token ids, or a list of those"

    def ids(v: list[Any]) -> bool:
        return bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)

    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and ids(prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt:
        out: list[str | list[int]] = []
        for i, one in enumerate(prompt):
            if isinstance(one, str):
                out.append(one)
            elif isinstance(one, list) and ids(one):
                out.append(list(one))
            else:
                raise bad(
                    f"prompt[{i}]", f"{expected} (prompt[{i}] is {one!r:.40})", "invalid_type"
                )
        return out
    raise bad(
        "prompt", expected, "missing_required_parameter" if prompt is None else "invalid_type"
    )


def parse_completion(body: Any) -> GenParams:
    from .params import COMPLETIONS, check  # every field honored or refused (the field walk)

    if isinstance(body, dict):
        check(body, COMPLETIONS)
    p = _common(body)
    if body.get("top_logprobs") is not None:
        raise bad(
            "top_logprobs",
            "'top_logprobs' is chat's: completions take 'logprobs' (alternatives per token)",
            "unsupported_parameter",
        )
    p.prompts = _prompts(body.get("prompt"))
    p.logprobs = _int(body, "logprobs", 0, MAX_LOGPROBS)
    echo = body.get("echo", False)
    if not isinstance(echo, bool) and echo is not None:
        raise bad("echo", f"'echo' must be a boolean, got {echo!r:.40}", "invalid_type")
    p.echo = bool(echo)
    if p.max_tokens is None:
        p.max_tokens = 16
    if p.max_tokens == 0 and not p.echo:
        raise bad("max_tokens", "'max_tokens' must be >= 1 (0 only with 'echo': true), got 0")
    if p.stream:
        for name, on in (("echo", p.echo), ("prompt", len(p.prompts) > 1)):
            if on:
                what = "several prompts" if name == "prompt" else f"'{name}'"
                raise bad(
                    name,
                    f"'stream' with {what} is not supported by this server: send it without "
                    "'stream'",
                    "unsupported_parameter",
                )
    return p


def _content(m: dict[str, Any], i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(
        isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
        for x in c
    ):
        return "".join(x["text"] for x in c)
    if c is None and m.get("role") == "assistant":
        return ""
    raise bad(
        f"messages[{i}].content",
        f"messages[{i}].content must be a string or a list of text parts",
        "invalid_type",
    )


def parse_chat(body: Any) -> GenParams:
    from .params import CHAT, check  # every field honored or refused (the field walk)

    if isinstance(body, dict):
        check(body, CHAT)
    p = _common(body)
    if body.get("echo") not in (None, False):
        raise bad(
            "echo",
            "'echo' is not supported on chat completions by this server (/v1/completions takes it)",
            "unsupported_parameter",
        )
    _chat_logprobs(body, p)
    if p.max_tokens == 0:
        raise bad("max_tokens", "'max_tokens' must be >= 1, got 0")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad(
            "messages",
            "'messages' must be a non-empty list",
            "missing_required_parameter" if messages is None else "invalid_type",
        )
    from .tools import parse_tool_fields, tool_message_fields

    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in (
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        ):
            raise bad(
                f"messages[{i}].role",
                f"messages[{i}] needs a role: system, user, assistant or tool",
                "invalid_type",
            )
        role = "system" if m["role"] == "developer" else m["role"]
        seen_calls = any("tool_calls" in o for o in out)
        out.append(
            {"role": role, "content": _content(m, i), **tool_message_fields(m, i, seen_calls)}
        )
    p.messages = out
    parse_tool_fields(body, p)
    return p


def _chat_logprobs(body: dict[str, Any], p: GenParams) -> None:
    """Chat's `logprobs` (a boolean) and `top_logprobs` (needs it); p.logprobs becomes the
    alternatives per token the scheduler records (None: no log-probs)."""
    lp = body.get("logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise bad("logprobs", f"'logprobs' must be a boolean, got {lp!r:.40}", "invalid_type")
    p.chat_logprobs = bool(lp)
    p.top_logprobs = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if p.top_logprobs is not None and not p.chat_logprobs:
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    if p.chat_logprobs:
        p.logprobs = p.top_logprobs or 0


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    rid: str,
    model: str,
    text: str,
    finish: str,
    use: dict[str, int],
    chat: bool,
    more: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole answer; `more`: the choices of a completion with several prompts or log-probs
    (`text` and `finish` are then unused); `logprobs`: a chat choice's."""
    if more is not None:
        choices = more
    elif chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": logprobs,
        }
        choices = [choice]
    else:
        choices = [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": use,
    }


def chunk_body(
    rid: str,
    model: str,
    created: int,
    piece: str | None,
    finish: str | None,
    chat: bool,
    use: dict[str, int] | None = None,
    first: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = (
            {"role": "assistant", "content": piece or ""}
            if first
            else ({"content": piece} if piece else {})
        )
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "finish_reason": finish,
            "logprobs": logprobs,
        }
    else:
        choice = {"index": 0, "text": piece or "", "finish_reason": finish, "logprobs": logprobs}
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if use is not None:
        body["usage"] = use
    return body


__all__ = [
    "APIError",
    "GenParams",
    "MAX_LOGPROBS",
    "parse_completion",
    "parse_chat",
    "completion_body",
    "chunk_body",
    "usage",
    "new_id",
]
