"""The grammar of an "auto" tool choice: free text, or calls the model's format allows, whose
arguments follow their functions' schemas.

Under `tool_choice: "auto"` the model decides whether to call. When a tool is `strict` (OpenAI's
promise: a call's arguments follow `parameters`), or when `response_format` constrains the
answer too, the output is constrained by a Lark grammar (llguidance's dialect) built here for
the template's call format (`tool_parse.tool_format`):

- Hermes: any text; once `<tool_call>` appears (a lazy lexeme: its first occurrence), the rest
  is `\\n{call}\\n</tool_call>` blocks joined by `\\n`, then the end.
- Llama 3 JSON: text that does not start with `{`, or (after an optional `<|python_tag|>`) calls
  `{"name", "parameters"}` joined by `; `.
- Mistral: text without the `[TOOL_CALLS]` tag that does not start with `[`, or text, the tag,
  and one JSON array of calls (the tag may be a special token; a bare array counts too).
- Mistral with `[ARGS]`: any text; once `[TOOL_CALLS]` appears, calls `name[ARGS]{arguments}`,
  each after its own `[TOOL_CALLS]` (the tags as special tokens when the vocabulary has them).

A call is `{"name": <a tool's name>, "arguments"|"parameters": <its schema>}`: a strict tool's
`parameters`, any JSON object for the others. One call only when `parallel_tool_calls` is false.
With `response_format` the text branch is its JSON instead (no text before a call). The JSON is
compact, as the other grammars write it (`runtime.grammar_spec.JSON_OPTIONS`). Invariant: every
output the grammar accepts is read by `tool_parse.ToolReader` as either text (or the response
JSON) with no call, or calls whose arguments follow their strict schemas.
"""

from __future__ import annotations

import json
from typing import Any

from llmir_core.runtime.grammar_spec import JSON_OPTIONS, GrammarSpec

from .schemas import GenParams
from .tool_parse import (
    ARGS_TAG,
    HERMES_CLOSE,
    HERMES_OPEN,
    MISTRAL_TAG,
    PYTHON_TAG,
    ToolFormat,
)

SOURCE = "tools"  # the 400's param when a strict tool's schema cannot be compiled
_ANY_TEXT = "/(?s:.*)/"


def wanted(p: GenParams) -> bool:
    """Does an "auto" request need the grammar: a strict tool, or a response_format?"""
    if p.tool_choice != "auto" or not p.tools:
        return False
    return p.grammar is not None or any(t["function"].get("strict") for t in p.tools)


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS}, ensure_ascii=False)


def _moved(node: Any, prefix: str) -> Any:
    """node with its local references (`#`, `#/$defs/X`, `#/definitions/X`) pointed at
    `#/$defs/<prefix>` and `#/$defs/<prefix>.X` (where `hoisted` puts them)."""
    if isinstance(node, list):
        return [_moved(v, prefix) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _moved(v, prefix) for k, v in node.items() if k not in ("$defs", "definitions")}
    ref = node.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        parts = ref[2:].split("/", 1) if ref != "#" else []
        if not parts:
            out["$ref"] = f"#/$defs/{prefix}"
        elif parts[0] in ("$defs", "definitions") and len(parts) == 2:
            out["$ref"] = f"#/$defs/{prefix}.{parts[1]}"
    return out


def hoisted(schemas: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Several root schemas placed inside one: each one's `$defs` (or `definitions`) and a
    copy of itself (for `#` references) go to the new root's `$defs` under `t<i>`, its
    references rewritten, so a nested schema's `$ref`s (pydantic's) still resolve."""
    out: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for i, schema in enumerate(schemas):
        local = {**schema.get("definitions", {}), **schema.get("$defs", {})}
        if not local and "$ref" not in json.dumps(schema):
            out.append(schema)
            continue
        prefix = f"t{i}"
        defs[prefix] = _moved(schema, prefix)
        for name, sub in local.items():
            defs[f"{prefix}.{name}"] = _moved(sub, prefix)
        out.append(defs[prefix])
    return out, defs


def call_schema(tools: list[dict[str, Any]], args_key: str, strict_only: bool) -> dict[str, Any]:
    """Any one of the tools' calls `{"name", args_key}` as one JSON schema; with strict_only
    the arguments of a tool not marked strict are any JSON object."""
    params = []
    for t in tools:
        fn = t["function"]
        given = fn.get("parameters") if fn.get("strict") or not strict_only else None
        params.append(given if given is not None else {"type": "object", "properties": {}})
    placed, defs = hoisted(params)
    one = [
        {
            "type": "object",
            "properties": {"name": {"const": t["function"]["name"]}, args_key: schema},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for t, schema in zip(tools, placed)
    ]
    return {"anyOf": one, **({"$defs": defs} if defs else {})}


def calls_array(one: dict[str, Any], parallel: bool) -> dict[str, Any]:
    """An array of one or more calls (exactly one when not `parallel`), `$defs` at its root."""
    items = {k: v for k, v in one.items() if k != "$defs"}
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    return {**array, **({"$defs": one["$defs"]} if "$defs" in one else {})}


def _call_schema(p: GenParams, args_key: str) -> dict[str, Any]:
    return call_schema(p.tools or [], args_key, strict_only=True)


def _lit(text: str) -> str:
    return json.dumps(text)


def _special(tokenizer: Any, text: str) -> int | None:
    """The id of `text` when the tokenizer has it as one special token."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return None
    i = tokenizer.token_to_id(text)
    added = backend.get_added_tokens_decoder()
    return int(i) if i is not None and i in added and added[i].special else None


def _hermes(p: GenParams, answer: str | None) -> str:
    call = _json(_call_schema(p, "arguments"))
    block = f'"\\n" call "\\n{HERMES_CLOSE}"'
    more = f' ("\\n{HERMES_OPEN}" {block})*' if p.parallel_tool_calls else ""
    calls = f"calls: {block}{more}\ncall: {call}\n"
    if answer is not None:
        return f'start: answer | "{HERMES_OPEN}" calls\nanswer: {answer}\n{calls}'
    return (
        f"start: TEXT | head calls\n"
        f"head[lazy]: {_ANY_TEXT} {_lit(HERMES_OPEN)}\n"
        f"TEXT: {_ANY_TEXT}\n{calls}"
    )


def _llama3(p: GenParams, answer: str | None, tokenizer: Any) -> str:
    call = _json(_call_schema(p, "parameters"))
    tag = _special(tokenizer, PYTHON_TAG)
    lead = f"<[{tag}]>? " if tag is not None else ""
    more = ' (";" " "? call)*' if p.parallel_tool_calls else ""
    calls = f"calls: {lead}call{more}\ncall: {call}\n"
    if answer is not None:
        return f"start: answer | calls\nanswer: {answer}\n{calls}"
    return (
        "start: TEXT | WS calls\nWS: /[ \\t\\n]*/\n"
        f"TEXT: {_ANY_TEXT} & ~/[ \\t\\n]*[{{](?s:.*)/\n{calls}"
    )


def _mistral(p: GenParams, answer: str | None, tokenizer: Any) -> str:
    array = calls_array(_call_schema(p, "arguments"), p.parallel_tool_calls)
    tag_id = _special(tokenizer, MISTRAL_TAG)
    tag = f"<[{tag_id}]>" if tag_id is not None else _lit(MISTRAL_TAG)
    calls = f"calls: {_json(array)}\n"
    if answer is not None:
        return f"start: answer | {tag}? calls\nanswer: {answer}\n{calls}"
    lazy = "[lazy]" if tag_id is None else ""  # a special token is never inside a lexeme
    head = f"head{lazy}: {_ANY_TEXT} {tag}\n"
    text = f"TEXT: {_ANY_TEXT} & ~/[ \\t\\n]*\\[(?s:.*)/\n"
    return f"start: TEXT | head calls | calls\n{head}{text}{calls}"


def _tag(tokenizer: Any, text: str) -> str:
    """A tag in a grammar: its special token when the vocabulary has one, else its text."""
    i = _special(tokenizer, text)
    return f"<[{i}]>" if i is not None else _lit(text)


def _mistral_args(p: GenParams, answer: str | None, tokenizer: Any) -> str:
    tag, args = _tag(tokenizer, MISTRAL_TAG), _tag(tokenizer, ARGS_TAG)
    tools = p.tools or []
    alternatives = []
    for i, t in enumerate(tools):  # each function's arguments: a document of their own
        fn = t["function"]
        schema = fn.get("parameters") if fn.get("strict") else None
        schema = schema if schema is not None else {"type": "object", "properties": {}}
        alternatives.append(f"call{i}: {_lit(fn['name'])} {args} c{i}\nc{i}: {_json(schema)}\n")
    call = "call: " + " | ".join(f"call{i}" for i in range(len(tools))) + "\n"
    more = f" ({tag} call)*" if p.parallel_tool_calls else ""
    calls = f"calls: call{more}\n{call}{''.join(alternatives)}"
    if answer is not None:
        return f"start: answer | {tag} calls\nanswer: {answer}\n{calls}"
    lazy = "[lazy]" if tag.startswith('"') else ""
    return f"start: TEXT | head calls\nhead{lazy}: {_ANY_TEXT} {tag}\nTEXT: {_ANY_TEXT}\n{calls}"


def auto_grammar(p: GenParams, fmt: ToolFormat, tokenizer: Any) -> GrammarSpec | None:
    """The grammar of an "auto" answer in format `fmt` (None: not `wanted`); p.grammar, when
    set, is the response_format it joins."""
    if not wanted(p):
        return None
    answer = None
    if p.grammar is not None:
        value = p.grammar.value if p.grammar.kind == "json_schema" else {"type": "object"}
        answer = _json(value)
    if fmt == "hermes":
        text = _hermes(p, answer)
    elif fmt == "llama3_json":
        text = _llama3(p, answer, tokenizer)
    elif fmt == "mistral_args":
        text = _mistral_args(p, answer, tokenizer)
    else:
        text = _mistral(p, answer, tokenizer)
    return GrammarSpec("lark", text, SOURCE)


__all__ = ["auto_grammar", "wanted", "SOURCE"]
