"""Tool calling on /v1/chat/completions: the request's `tools`, `tool_choice` and
`parallel_tool_calls`, the messages that carry tool use, and the model's answer turned back into
`tool_calls`.

Requests (`parse_tool_fields`, `tool_message_fields`): `tools` is a list of
`{"type": "function", "function": {"name", "description", "parameters", "strict"}}`;
`tool_choice` is "none", "auto" (the default with tools), "required" or
`{"type": "function", "function": {"name"}}`. An assistant message may carry `tool_calls` (their
`arguments` JSON text reaches the template as an object, as Hugging Face templates expect) and a
`tool` message answers one by its `tool_call_id`.

The chat template gets the tools as `tools=[...]` (Hugging Face's convention) unless
`tool_choice` is "none". A forced choice ("required" or a named function) constrains the output
with a JSON-schema grammar (`GenParams.grammar`): a named function's output is its arguments, a
"required" one is `{"name", "arguments"}` (an array of them when `parallel_tool_calls`).

Answers: with "auto" the text is read for calls in the format the template taught
(`tool_parse`: Hermes `<tool_call>`, Llama 3 JSON, Mistral `[TOOL_CALLS]`); a forced choice's
JSON becomes its calls. Calls become the message's `tool_calls` (`content`: the text before
them, or None) with finish_reason "tool_calls"; a malformed call leaves the whole answer as
content. A stream holds text back from where a call may start and sends the calls as
`delta.tool_calls` chunks when the answer ends.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from llmir_core.runtime.grammar_spec import GrammarSpec

from .schemas import APIError, GenParams, bad
from .tool_grammar import call_schema, calls_array
from .tool_parse import MISTRAL_ID, ToolReader, tool_format

MAX_TOOLS = 128  # OpenAI's limit on `tools`
MAX_NAME = 64
_NAME = re.compile(r"[A-Za-z0-9_-]+")
CHOICES = ("none", "auto", "required")


def _kind(v: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if v is None:
        return "null"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return "a number"
    return names.get(type(v), type(v).__name__)


def _type_error(param: str, expected: str, v: Any) -> APIError:
    return bad(
        param,
        f"Invalid type for '{param}': expected {expected}, but got {_kind(v)} instead.",
        "invalid_type",
    )


def _missing(param: str) -> APIError:
    return bad(param, f"Missing required parameter: '{param}'.", "missing_required_parameter")


def _known(obj: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """A 400 for a key the server would not act on (never silently dropped)."""
    for key in obj:
        if key not in allowed:
            raise bad(f"{where}.{key}", f"Unknown parameter: '{where}.{key}'.", "unknown_parameter")


def _check_name(param: str, name: Any) -> str:
    if name is None:
        raise _missing(param)
    if not isinstance(name, str):
        raise _type_error(param, "a string", name)
    if len(name) > MAX_NAME:
        raise bad(
            param,
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{MAX_NAME}, but got a string with length {len(name)} instead.",
            "string_above_max_length",
        )
    if not _NAME.fullmatch(name):
        raise bad(
            param,
            f"Invalid '{param}': string does not match pattern. Expected a string that matches "
            "the pattern '^[a-zA-Z0-9_-]+$'.",
        )
    return name


def _tool(i: int, t: Any) -> dict[str, Any]:
    """One entry of `tools`, checked; returned as given (the template sees the caller's dict)."""
    where = f"tools[{i}]"
    if not isinstance(t, dict):
        raise _type_error(where, "an object", t)
    if t.get("type") != "function":
        if "type" not in t:
            raise _missing(f"{where}.type")
        raise bad(
            f"{where}.type",
            f"Invalid value: {t['type']!r:.40}. Supported values are: 'function'.",
        )
    fn = t.get("function")
    if fn is None:
        raise _missing(f"{where}.function")
    if not isinstance(fn, dict):
        raise _type_error(f"{where}.function", "an object", fn)
    _known(t, ("type", "function"), where)
    _known(fn, ("name", "description", "parameters", "strict"), f"{where}.function")
    _check_name(f"{where}.function.name", fn.get("name"))
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise _type_error(f"{where}.function.description", "a string", fn["description"])
    if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
        raise _type_error(f"{where}.function.parameters", "an object", fn["parameters"])
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise _type_error(f"{where}.function.strict", "a boolean", fn["strict"])
    return t


def _tools(v: Any) -> list[dict[str, Any]] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise _type_error("tools", "an array of objects", v)
    if not v:
        raise bad(
            "tools",
            "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.",
            "empty_array",
        )
    if len(v) > MAX_TOOLS:
        raise bad(
            "tools",
            f"Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, "
            f"but got an array with length {len(v)} instead.",
            "array_above_max_length",
        )
    tools = [_tool(i, t) for i, t in enumerate(v)]
    seen: set[str] = set()
    for i, t in enumerate(tools):
        name = t["function"]["name"]
        if name in seen:
            raise bad(
                f"tools[{i}].function.name",
                f"Invalid 'tools[{i}].function.name': the function '{name}' is declared twice.",
            )
        seen.add(name)
    return tools


def _choice(v: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any]:
    """`tool_choice`: "none", "auto", "required", or the named function's `{"name"}`."""
    if v is None:
        return "auto" if tools else "none"
    if tools is None and v != "none":
        raise bad(
            "tool_choice",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
            "specified.",
        )
    if isinstance(v, str):
        if v not in CHOICES:
            raise bad(
                "tool_choice",
                f"Invalid value: {v!r:.40}. Supported values are: 'none', 'auto', and 'required'.",
            )
        return v
    if not isinstance(v, dict):
        raise _type_error("tool_choice", "a string or an object", v)
    if v.get("type") != "function":
        raise bad(
            "tool_choice.type",
            f"Invalid value: {v.get('type')!r:.40}. Supported values are: 'function'.",
        )
    fn = _required(v, "function", dict, "tool_choice")
    _known(v, ("type", "function"), "tool_choice")
    _known(fn, ("name",), "tool_choice.function")
    name = _check_name("tool_choice.function.name", fn.get("name"))
    if not any(t["function"]["name"] == name for t in tools or ()):
        raise bad(
            "tool_choice",
            f"Invalid value for 'tool_choice': no function named '{name}' in 'tools'.",
        )
    return {"name": name}


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters")
    return params if params is not None else {"type": "object", "properties": {}}


def forced_schema(p: GenParams) -> dict[str, Any] | None:
    """The JSON schema a forced choice's whole output must follow (None: not forced)."""
    tools = p.tools or []
    if isinstance(p.tool_choice, dict):
        named = next(t for t in tools if t["function"]["name"] == p.tool_choice["name"])
        return _parameters(named)
    if p.tool_choice != "required":
        return None
    one = call_schema(tools, "arguments", strict_only=False)
    return calls_array(one, parallel=True) if p.parallel_tool_calls else one


def parse_tool_fields(body: dict[str, Any], p: GenParams) -> None:
    """Fill `p.tools`, `p.tool_choice`, `p.parallel_tool_calls` (and `p.grammar` for a forced
    choice) from a chat request body, or raise a 400 naming the field."""
    p.tools = _tools(body.get("tools"))
    p.tool_choice = _choice(body.get("tool_choice"), p.tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _type_error("parallel_tool_calls", "a boolean", parallel)
    if parallel is not None and p.tools is None:
        raise bad(
            "parallel_tool_calls",
            "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when "
            "'tools' are specified.",
        )
    p.parallel_tool_calls = True if parallel is None else parallel
    schema = forced_schema(p)
    if schema is not None:
        if p.grammar is not None:
            raise bad(
                "tool_choice",
                f"a forced 'tool_choice' constrains the output itself: it cannot be combined "
                f"with {p.grammar.source or 'another grammar'}",
                "unsupported_parameter",
            )
        p.grammar = GrammarSpec("json_schema", schema, "tool_choice")


def _arguments_for_template(text: str) -> Any:
    """A call's `arguments` as the template sees them: the decoded object when they are JSON
    (what Hugging Face templates expect; they `tojson` it), else the text as given."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def tool_message_fields(m: dict[str, Any], i: int, seen_calls: bool) -> dict[str, Any]:
    """The tool-use fields of `messages[i]` kept for the template: an assistant's `tool_calls`,
    a tool message's `tool_call_id` (and `name`). `seen_calls`: an earlier message had calls."""
    out: dict[str, Any] = {}
    role = m.get("role")
    calls = m.get("tool_calls")
    if calls is not None:
        where = f"messages[{i}].tool_calls"
        if role != "assistant":
            raise bad(where, f"'{where}' is only allowed on assistant messages")
        if not isinstance(calls, list):
            raise _type_error(where, "an array of objects", calls)
        out["tool_calls"] = [_message_call(f"{where}[{j}]", c) for j, c in enumerate(calls)]
    if role == "tool":
        where = f"messages[{i}].tool_call_id"
        cid = m.get("tool_call_id")
        if cid is None:
            raise _missing(where)
        if not isinstance(cid, str):
            raise _type_error(where, "a string", cid)
        if not seen_calls:
            raise bad(
                f"messages[{i}].role",
                "Invalid parameter: messages with role 'tool' must be a response to a preceding "
                "message with 'tool_calls'.",
            )
        out["tool_call_id"] = cid
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise _type_error(f"messages[{i}].name", "a string", name)
        out["name"] = name
    return out


def _required(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """obj[key], which must be there and of `kind` (a 400 naming `where.key` otherwise)."""
    v = obj.get(key)
    if v is None:
        raise _missing(f"{where}.{key}")
    if not isinstance(v, kind):
        raise _type_error(f"{where}.{key}", "a string" if kind is str else "an object", v)
    return v


def _message_call(where: str, c: Any) -> dict[str, Any]:
    """One of an assistant message's `tool_calls`, as the template receives it."""
    if not isinstance(c, dict):
        raise _type_error(where, "an object", c)
    _known(c, ("id", "type", "function"), where)
    cid = _required(c, "id", str, where)
    if c.get("type", "function") != "function":
        raise bad(
            f"{where}.type", f"Invalid value: {c['type']!r:.40}. Supported values are: 'function'."
        )
    fn = _required(c, "function", dict, where)
    _known(fn, ("name", "arguments"), f"{where}.function")
    name = _required(fn, "name", str, f"{where}.function")
    args = _required(fn, "arguments", str, f"{where}.function")
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": _arguments_for_template(args)},
    }


def template_tools(p: GenParams) -> list[dict[str, Any]] | None:
    """The tools the chat template receives: none when `tool_choice` is "none"."""
    return None if p.tool_choice == "none" else p.tools


@functools.lru_cache(maxsize=16)
def uses_tools(template: str) -> bool:
    """Whether a chat template reads a `tools` variable (a template that fails to parse here
    fails again when it renders, with its own message)."""
    import jinja2
    from jinja2 import meta

    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        return "tools" in meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateError:
        return re.search(r"\btools\b", template) is not None


def check_template(template: str, tools: list[dict[str, Any]] | None) -> None:
    """A 400 naming `tools` when they would reach a template that never reads them."""
    if tools and not uses_tools(template):
        raise bad(
            "tools",
            "this model's chat template does not use 'tools', so the model cannot be offered "
            "them: serve it with a tool-aware template (--chat-template chatml, llama3 or a "
            "file), or send 'tool_choice': 'none'",
            "unsupported_parameter",
        )


def template_messages(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """The messages as the template needs them: a Mistral template accepts only call ids of 9
    letters and digits, so longer ids are cut to their last 9 (as vLLM does)."""
    if not tool_format(template).startswith("mistral"):
        return messages

    def cut(cid: str) -> str:
        return cid[-MISTRAL_ID:]

    out = []
    for m in messages:
        if "tool_calls" in m:
            m = {**m, "tool_calls": [{**c, "id": cut(c["id"])} for c in m["tool_calls"]]}
        if "tool_call_id" in m:
            m = {**m, "tool_call_id": cut(m["tool_call_id"])}
        out.append(m)
    return out


def reader_for(p: GenParams, template: str | None) -> ToolReader | None:
    """The reader of a request's answer: None when its output is plain text."""
    if template_tools(p) is None or template is None:
        return None
    return ToolReader(
        tool_format(template),
        {t["function"]["name"] for t in p.tools or ()},
        forced=forced_schema(p) is not None,
        named=p.tool_choice["name"] if isinstance(p.tool_choice, dict) else None,
        parallel=p.parallel_tool_calls,
    )


def finish_choice(choice: dict[str, Any], reader: ToolReader) -> None:
    """Turn a whole chat choice's message into tool calls when its text holds them."""
    content, calls = reader.read(choice["message"]["content"])
    if calls:
        choice["message"]["content"] = content
        choice["message"]["tool_calls"] = [c.body() for c in calls]
        choice["finish_reason"] = "tool_calls"


__all__ = [
    "parse_tool_fields",
    "tool_message_fields",
    "template_tools",
    "check_template",
    "uses_tools",
    "forced_schema",
    "reader_for",
    "template_messages",
    "finish_choice",
]
