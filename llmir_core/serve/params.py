"""Every request field of `/v1/chat/completions` and `/v1/completions`: honored, a no-op, or refused.

`PARAMS` is the field walk: one `Param` per field and endpoint, covering every field of the
request schemas of OpenAI's API (tests/serve/test_param_walk.py walks the openai SDK's own
request types against it, so a field the SDK adds fails that test until it is listed here) and
the extras vLLM and llama.cpp clients send that the server honors (`EXTRAS`).

- **honored**: the server acts on it; `meaning` says how and `tests` names the tests that show it.
- **noop**: informational for OpenAI too (it never changes the answer): accepted, type-checked,
  and without effect; `tests` shows the answer is the same without it.
- **refused**: the server cannot act on it; a value other than the ones in `off` (which ask for
  nothing) is 400 `unsupported_parameter` naming the field, with `meaning` as the reason;
  `sample` is a refused value (the walk sends it).

Any other field is 400 `unknown_parameter`, "Unrecognized request argument supplied: NAME", as
OpenAI answers. `check(body, endpoint)` applies the table to a request body; docs/serve-api.md is
generated from it (scripts/gen_serve_api_docs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .schemas import bad

CHAT = "chat"
COMPLETIONS = "completions"
ENDPOINTS = (CHAT, COMPLETIONS)
PATHS = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions"}
Status = Literal["honored", "noop", "refused"]

_SAMPLING = "tests/serve/test_sampling_params.py"
_FIELDS = "tests/serve/test_fields.py"
_API = "tests/serve/test_openai_api.py"
_LOGPROBS = "tests/serve/test_logprobs.py"
_TOOLS = "tests/serve/test_tools.py"


@dataclass(frozen=True)
class Param:
    name: str
    endpoints: tuple[str, ...]
    status: Status
    meaning: str  # honored / noop: what it does; refused: why
    tests: tuple[str, ...] = ()  # "tests/serve/test_x.py::test_y"
    off: tuple[Any, ...] = ()  # refused: values that ask for nothing (accepted)
    sample: Any = None  # refused: a value the server refuses
    extra: bool = False  # not OpenAI's: a vLLM / llama.cpp extension
    accepts: Callable[[Any, dict[str, Any]], bool] | None = None  # refused: off beyond `off`
    check_value: Callable[[Any, dict[str, Any]], str | None] | None = None  # -> a complaint


def _both(name: str, status: Status, meaning: str, *tests: str, **kw: Any) -> Param:
    return Param(name, ENDPOINTS, status, meaning, tuple(tests), **kw)


def _chat(name: str, status: Status, meaning: str, *tests: str, **kw: Any) -> Param:
    return Param(name, (CHAT,), status, meaning, tuple(tests), **kw)


def _completions(name: str, status: Status, meaning: str, *tests: str, **kw: Any) -> Param:
    return Param(name, (COMPLETIONS,), status, meaning, tuple(tests), **kw)


def _string(v: Any, body: dict[str, Any]) -> str | None:
    return None if isinstance(v, str) else "must be a string"


def _metadata(v: Any, body: dict[str, Any]) -> str | None:
    if not isinstance(v, dict) or len(v) > 16:
        return "must be an object of at most 16 key-value pairs"
    for k, x in v.items():
        if len(k) > 64 or not isinstance(x, str) or len(x) > 512:
            return "must map keys of at most 64 characters to strings of at most 512"
    return None


def _stream_options(v: Any, body: dict[str, Any]) -> str | None:
    if not body.get("stream"):
        return "is only allowed when 'stream' is true"
    if not isinstance(v, dict):
        return "must be an object"
    for k, x in v.items():
        if k not in ("include_usage", "include_obfuscation"):
            return f"has no field '{k}' (include_usage, include_obfuscation)"
        if not isinstance(x, bool):
            return f"field '{k}' must be a boolean"
    return None


def _best_of_is_n(v: Any, body: dict[str, Any]) -> bool:
    """best_of equal to n generates no extra candidate: nothing to choose from."""
    n = body.get("n", 1)
    return isinstance(v, int) and not isinstance(v, bool) and v == (1 if n is None else n)


_INFO = "informational: it never changes the answer (OpenAI uses it for"
_NOOP_TEST = f"{_FIELDS}::test_informational_fields_change_nothing"

PARAMS: tuple[Param, ...] = (
    # -- the request -------------------------------------------------------------------------
    _both(
        "model",
        "honored",
        "the served model's id (GET /v1/models); any other is 404 model_not_found",
        f"{_API}::test_openai_errors",
    ),
    _chat(
        "messages",
        "honored",
        "the conversation, rendered with the chat template (the model's or --chat-template); "
        "text content only",
        f"{_API}::test_chat_equals_run_chat",
    ),
    _completions(
        "prompt",
        "honored",
        "a string, a list of token ids, or a list of either (one choice per prompt, by index)",
        f"{_API}::test_completion_equals_run",
        f"{_LOGPROBS}::test_batched_token_id_prompts",
    ),
    # -- length and stopping -----------------------------------------------------------------
    _both(
        "max_tokens",
        "honored",
        "tokens to generate at most (completions: default 16; chat: the rest of the context)",
        f"{_FIELDS}::test_max_tokens",
    ),
    _chat(
        "max_completion_tokens",
        "honored",
        "the same as max_tokens (its newer name); wins when both are given",
        f"{_FIELDS}::test_max_tokens",
    ),
    _completions(
        "stop",
        "honored",
        "up to 4 strings; the text ends before the first one generated (finish_reason stop)",
        f"{_API}::test_stop_string",
    ),
    _chat(
        "stop",
        "honored",
        "up to 4 strings; the text ends before the first one generated (finish_reason stop)",
        f"{_FIELDS}::test_chat_top_p_and_stop",
    ),
    # -- sampling ------------------------------------------------------------------------------
    _completions(
        "temperature",
        "honored",
        "softmax temperature in [0, 2]; 0 is greedy",
        f"{_API}::test_completion_equals_run",
    ),
    _chat(
        "temperature",
        "honored",
        "softmax temperature in [0, 2]; 0 is greedy",
        f"{_API}::test_chat_equals_run_chat",
    ),
    _completions(
        "top_p",
        "honored",
        "nucleus sampling: the smallest set of tokens with this probability mass, in (0, 1]",
        f"{_API}::test_completion_equals_run",
    ),
    _chat(
        "top_p",
        "honored",
        "nucleus sampling: the smallest set of tokens with this probability mass, in (0, 1]",
        f"{_FIELDS}::test_chat_top_p_and_stop",
    ),
    _completions(
        "seed",
        "honored",
        "the same seed and parameters give the same text (as `llmir run --seed`)",
        f"{_API}::test_completion_equals_run",
    ),
    _chat(
        "seed",
        "honored",
        "the same seed and parameters give the same text (as `llmir run --seed`)",
        f"{_API}::test_chat_equals_run_chat",
    ),
    _both(
        "n",
        "honored",
        "choices per prompt, sampled from one shared prefill",
        "tests/serve/test_n.py::test_n_choices",
    ),
    _both(
        "logit_bias",
        "honored",
        "token id -> bias in [-100, 100] added to its logit before sampling",
        f"{_SAMPLING}::test_logit_bias",
    ),
    _both(
        "presence_penalty",
        "honored",
        "in [-2, 2]: subtracted once from the logit of every token generated so far",
        f"{_SAMPLING}::test_presence_penalty",
    ),
    _both(
        "frequency_penalty",
        "honored",
        "in [-2, 2]: subtracted from a token's logit once per time it was generated",
        f"{_SAMPLING}::test_frequency_penalty",
    ),
    # -- streaming -----------------------------------------------------------------------------
    _both(
        "stream",
        "honored",
        "server-sent events, one chunk per piece of text, ending with data: [DONE]",
        f"{_API}::test_completion_equals_run",
        f"{_API}::test_chat_equals_run_chat",
    ),
    _both(
        "stream_options",
        "honored",
        "only with stream: true; include_usage: the last chunk carries usage (it always does "
        "here); include_obfuscation: accepted, no padding is ever added",
        f"{_FIELDS}::test_stream_options",
        check_value=_stream_options,
    ),
    # -- log-probabilities ---------------------------------------------------------------------
    _completions(
        "logprobs",
        "honored",
        "0..20: each token's log-probability and that many alternatives",
        f"{_LOGPROBS}::test_generated_logprobs_equal_the_logits_of_each_step",
    ),
    _completions(
        "echo",
        "honored",
        "the prompt comes back before the text, with its log-probabilities when logprobs is set",
        f"{_LOGPROBS}::test_echo_logprobs_equal_a_direct_log_softmax",
    ),
    _chat(
        "logprobs",
        "honored",
        "true: each generated token's log-probability in choices[].logprobs.content",
        "tests/serve/test_chat_logprobs.py::test_chat_logprobs",
    ),
    _chat(
        "top_logprobs",
        "honored",
        "0..20 alternatives per token (with logprobs: true)",
        "tests/serve/test_chat_logprobs.py::test_chat_top_logprobs",
    ),
    # -- structured output and tools -----------------------------------------------------------
    _chat(
        "response_format",
        "honored",
        "text, json_object, or json_schema: the output is constrained by a grammar to parse "
        "(and validate against the schema)",
        "tests/serve/test_structured.py::test_response_format_json_schema",
        "tests/serve/test_structured.py::test_response_format_json_object",
    ),
    _completions(
        "response_format",
        "honored",
        "as on chat (vLLM takes it on completions too): the text is constrained by a grammar",
        "tests/serve/test_structured.py::test_completions_take_response_format",
        extra=True,
    ),
    _chat(
        "tools",
        "honored",
        "functions the chat template receives; calls come back as tool_calls; a `strict` "
        "function's arguments follow its parameters schema (a grammar), under auto too",
        f"{_TOOLS}::test_tools_auto",
        f"{_TOOLS}::test_auto_strict_calls_follow_the_schema",
        f"{_TOOLS}::test_auto_tools_with_a_response_format",
    ),
    _chat(
        "tool_choice",
        "honored",
        "none, auto, required, or a named function (its arguments constrained by its schema)",
        f"{_TOOLS}::test_tool_choice_named",
        f"{_TOOLS}::test_tool_choice_required",
        f"{_TOOLS}::test_tool_choice_none",
    ),
    _chat(
        "parallel_tool_calls",
        "honored",
        "false: at most one tool call per answer",
        f"{_TOOLS}::test_parallel_tool_calls",
    ),
    # -- informational ---------------------------------------------------------------------------
    _both(
        "user",
        "noop",
        f"{_INFO} abuse monitoring and cache bucketing); a string",
        _NOOP_TEST,
        check_value=_string,
    ),
    _chat(
        "safety_identifier",
        "noop",
        f"{_INFO} abuse monitoring); a string",
        _NOOP_TEST,
        check_value=_string,
    ),
    _chat(
        "prompt_cache_key",
        "noop",
        f"{_INFO} cache bucketing; this server keeps no prompt cache); a string",
        _NOOP_TEST,
        check_value=_string,
    ),
    _chat(
        "metadata",
        "noop",
        f"{_INFO} tags on a stored completion, and nothing is stored without store: true, "
        "which is refused); up to 16 string pairs",
        _NOOP_TEST,
        check_value=_metadata,
    ),
    # -- refused ---------------------------------------------------------------------------------
    _chat(
        "store",
        "refused",
        "this server stores no completions",
        off=(False,),
        sample=True,
    ),
    _chat(
        "audio",
        "refused",
        "this server generates text only",
        sample={"voice": "alloy", "format": "wav"},
    ),
    _chat(
        "modalities",
        "refused",
        'this server generates text only (["text"] is accepted)',
        off=(["text"],),
        sample=["text", "audio"],
    ),
    _chat(
        "prediction",
        "refused",
        "predicted outputs (speculative decoding from given text) are not implemented",
        sample={"type": "content", "content": "Hello"},
    ),
    _chat(
        "reasoning_effort",
        "refused",
        'the models served here do no hidden reasoning ("none" is accepted)',
        off=("none",),
        sample="low",
    ),
    _chat(
        "verbosity",
        "refused",
        'no control of answer length beyond max_tokens ("medium", the default, is accepted)',
        off=("medium",),
        sample="low",
    ),
    _chat(
        "web_search_options",
        "refused",
        "this server does not search the web",
        sample={"search_context_size": "low"},
    ),
    _chat(
        "moderation",
        "refused",
        "this server runs no moderation model",
        sample={"model": "omni-moderation-latest"},
    ),
    _chat(
        "service_tier",
        "refused",
        'one processing tier ("auto" and "default" are accepted)',
        off=("auto", "default"),
        sample="flex",
    ),
    _chat(
        "prompt_cache_retention",
        "refused",
        'this server keeps no prompt cache, so it cannot promise a retention ("in_memory" is '
        "accepted)",
        off=("in_memory",),
        sample="24h",
    ),
    _chat(
        "prompt_cache_options",
        "refused",
        "this server keeps no prompt cache, so it cannot promise a lifetime ({} is accepted)",
        off=({},),
        sample={"ttl": "30m"},
    ),
    _chat(
        "functions",
        "refused",
        "deprecated by OpenAI: use tools",
        off=([],),
        sample=[{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
    ),
    _chat(
        "function_call",
        "refused",
        'deprecated by OpenAI: use tool_choice ("none" is accepted)',
        off=("none",),
        sample="auto",
    ),
    _completions(
        "best_of",
        "refused",
        "generating extra candidates to keep the best is not implemented (1, or equal to n, "
        "is accepted)",
        off=(1,),
        sample=3,
        accepts=_best_of_is_n,
    ),
    _completions(
        "suffix",
        "refused",
        'fill-in-the-middle is not implemented ("" is accepted)',
        off=("",),
        sample="}",
    ),
    _chat(
        "echo",
        "refused",
        "vLLM's echo of the last message on chat is not implemented (/v1/completions takes echo)",
        off=(False,),
        sample=True,
        extra=True,
    ),
    _completions(
        "top_logprobs",
        "refused",
        "chat's field: /v1/completions takes logprobs, the number of alternatives per token",
        sample=2,
        extra=True,
    ),
    # -- extras: vLLM's and llama.cpp's sampling parameters ---------------------------------------
    _both(
        "top_k",
        "honored",
        "sample from the k most likely tokens (0: off)",
        f"{_SAMPLING}::test_top_k",
        extra=True,
    ),
    _both(
        "min_p",
        "honored",
        "drop tokens less likely than min_p times the most likely one, in [0, 1]",
        f"{_SAMPLING}::test_min_p",
        extra=True,
    ),
    _both(
        "repetition_penalty",
        "honored",
        "> 0: the logits of tokens already seen are divided by it (positive logits) or "
        "multiplied by it (negative ones); 1 is off",
        f"{_SAMPLING}::test_repetition_penalty",
        extra=True,
    ),
)

EXTRAS = tuple(sorted({p.name for p in PARAMS if p.extra}))


def table(endpoint: str) -> dict[str, Param]:
    """The fields of one endpoint by name."""
    return {p.name: p for p in PARAMS if endpoint in p.endpoints}


_TABLES = {e: table(e) for e in ENDPOINTS}


def _off(p: Param, v: Any, body: dict[str, Any]) -> bool:
    if any(v == o and type(v) is type(o) for o in p.off):
        return True
    return p.accepts is not None and p.accepts(v, body)


def check(body: dict[str, Any], endpoint: str) -> None:
    """Refuse a field of `body` the server does not act on (400 naming it): unknown fields
    (unknown_parameter) and refused fields set to anything but their "off" values
    (unsupported_parameter); type-check the no-op fields. null is the same as absent."""
    fields = _TABLES[endpoint]
    for name, value in body.items():
        p = fields.get(name)
        if p is None:
            other = next((e for e in ENDPOINTS if e != endpoint and name in _TABLES[e]), None)
            where = f" (it is a {PATHS[other]} parameter)" if other else ""
            raise bad(
                name, f"Unrecognized request argument supplied: {name}{where}", "unknown_parameter"
            )
        if value is None:
            continue
        if p.status == "refused" and not _off(p, value, body):
            raise bad(
                name,
                f"'{name}' is not supported by this server: {p.meaning}",
                "unsupported_parameter",
            )
        if p.check_value is not None:
            complaint = p.check_value(value, body)
            if complaint is not None:
                code = "invalid_type" if complaint.startswith("must") else "invalid_value"
                raise bad(name, f"'{name}' {complaint}", code)


__all__ = ["CHAT", "COMPLETIONS", "ENDPOINTS", "EXTRAS", "PARAMS", "Param", "check", "table"]
