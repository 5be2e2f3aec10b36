"""Tool calls read back from a model's answer, in the format its chat template taught it.

`tool_format(template)` tells the format by the template's markers: Hermes `<tool_call>`
blocks holding `{"name", "arguments"}` (Qwen2.5, Hermes, the built-in chatml), Mistral's
`[TOOL_CALLS]` followed by a JSON array of calls (the tag is a special token, so a decoded
answer may start with the bare array), Mistral's newer `[TOOL_CALLS]name[ARGS]{...}` per call
(`mistral_args`: Mistral Small 3.2, Devstral, Magistral; both tags are special tokens, so a
decoded answer holds `name{...}`, a call's name right before its arguments' object), else
Llama 3's JSON `{"name", "parameters"}` starting the answer (after an optional
`<|python_tag|>`; several joined by `;`).

A call's id is `call_` and 24 hex digits, except for Mistral's format: 9 hex digits (its
templates refuse other ids).

`parse_calls` reads a whole answer, `parse_forced` the JSON of a forced tool choice, and
`ToolReader` does either over a stream, holding text back from the first character a call may
start at. All or nothing: a call naming a function not offered, or whose arguments are not a
JSON object, or text after the calls, leaves the whole answer as content.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

ToolFormat = Literal["hermes", "llama3_json", "mistral", "mistral_args"]
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"
ARGS_TAG = "[ARGS]"
MISTRAL_ID = 9  # the length of a call id Mistral's templates accept


@functools.lru_cache(maxsize=16)
def tool_format(template: str) -> ToolFormat:
    """How a template's model writes calls: by its markers; otherwise Llama 3's JSON."""
    if HERMES_OPEN in template:
        return "hermes"
    if MISTRAL_TAG in template and ARGS_TAG in template:
        return "mistral_args"
    if MISTRAL_TAG in template:
        return "mistral"
    return "llama3_json"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def body(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _call(obj: Any, names: set[str], args_key: tuple[str, ...] = ("arguments",)) -> ToolCall:
    """A call from its decoded JSON `{"name", "arguments"}`; ValueError when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a call object")
    if obj["name"] not in names:
        raise ValueError(f"unknown function {obj['name']!r}")
    key = next((k for k in args_key if k in obj), None)
    args = obj.get(key) if key else {}
    if isinstance(args, str):
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError("the arguments are not an object")
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_values(text: str) -> list[Any]:
    """The JSON values of `text`, one after another, separated by whitespace or `;`."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    at = 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return out
        value, at = dec.raw_decode(text, at)
        out.append(value)


def _hermes(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    start = text.find(HERMES_OPEN)
    if start < 0:
        raise ValueError("no call")
    calls, rest = [], text[start:]
    while rest.strip():
        if not rest.lstrip().startswith(HERMES_OPEN):
            raise ValueError("text after a call")
        rest = rest.lstrip()[len(HERMES_OPEN) :]
        end = rest.find(HERMES_CLOSE)
        inner, rest = (rest, "") if end < 0 else (rest[:end], rest[end + len(HERMES_CLOSE) :])
        calls.append(_call(json.loads(inner), names))
    return text[:start], calls


def _llama3(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    body = text.lstrip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :]
    if not body.lstrip().startswith("{"):
        raise ValueError("no call")
    return "", [_call(v, names, ("parameters", "arguments")) for v in _json_values(body)]


def _mistral(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    start = text.find(MISTRAL_TAG)
    before, body = (text[:start], text[start + len(MISTRAL_TAG) :]) if start >= 0 else ("", text)
    if start < 0 and not body.lstrip().startswith("["):
        raise ValueError("no call")
    values = _json_values(body)
    if len(values) != 1 or not isinstance(values[0], list) or not values[0]:
        raise ValueError("not one array of calls")
    return before, [_call(v, names) for v in values[0]]


def _named_calls(text: str, names: set[str]) -> list[ToolCall]:
    """`name{...}` calls, one after another (tags and whitespace between them allowed), to the
    end of `text`; ValueError when text is not that."""
    dec = json.JSONDecoder()
    calls: list[ToolCall] = []
    at = 0
    while True:
        while True:  # whitespace and the tags (when they were decoded as text)
            rest = text[at:].lstrip()
            at = len(text) - len(rest)
            tag = next((t for t in (MISTRAL_TAG, ARGS_TAG) if rest.startswith(t)), None)
            if tag is None:
                break
            at += len(tag)
        if at == len(text):
            if not calls:
                raise ValueError("no call")
            return calls
        name = max((n for n in names if text.startswith(n, at)), key=len, default=None)
        if name is None:
            raise ValueError("not a function's name")
        at += len(name)
        if text.startswith(ARGS_TAG, at):
            at += len(ARGS_TAG)
        args, at = dec.raw_decode(text, at)
        calls.append(_call({"name": name, "arguments": args}, names))


def _call_starts(text: str, names: set[str]) -> list[int]:
    """Where a `mistral_args` call may start: a name followed by `{` or a tag, or the tag."""
    out = set(_find_all(text, MISTRAL_TAG))
    for n in names:
        for i in _find_all(text, n):
            after = text[i + len(n) : i + len(n) + 1]
            if after in ("{", "["):
                out.add(i)
    return sorted(out)


def _find_all(text: str, word: str) -> list[int]:
    out, i = [], text.find(word)
    while i >= 0:
        out.append(i)
        i = text.find(word, i + 1)
    return out


def _mistral_args(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    for start in _call_starts(text, names):  # the first place the rest is all calls
        try:
            return text[:start], _named_calls(text[start:], names)
        except ValueError:
            continue
    raise ValueError("no call")


_PARSERS = {
    "hermes": _hermes,
    "llama3_json": _llama3,
    "mistral": _mistral,
    "mistral_args": _mistral_args,
}


def parse_calls(text: str, fmt: ToolFormat, names: set[str]) -> tuple[str | None, list[ToolCall]]:
    """(content before the calls or None, the calls) of an answer in format `fmt`; ValueError
    (json's errors included) when it holds no call or a malformed one."""
    before, calls = _PARSERS[fmt](text, names)
    if not calls:
        raise ValueError("no call")
    return (before.rstrip() or None), calls


def parse_forced(text: str, names: set[str], named: str | None = None) -> list[ToolCall]:
    """The calls of a forced choice's output (JSON a grammar made): `named`'s arguments, or
    one `{"name", "arguments"}` object or an array of them; ValueError when it is not."""
    value = json.loads(text)
    if named is not None:
        return [_call({"name": named, "arguments": value}, names)]
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError("no call")
    return [_call(v, names) for v in items]


class ToolReader:
    """Reads one answer's text as it streams (`feed`) or whole (`read`) into content and calls."""

    def __init__(
        self,
        fmt: ToolFormat,
        names: set[str],
        *,
        forced: bool = False,
        named: str | None = None,
        parallel: bool = True,
    ) -> None:
        self.fmt = fmt
        self.names = names
        self.forced = forced  # the whole output is JSON: `parse_forced`
        self.named = named  # forced to this function: the output is its arguments
        self.parallel = parallel  # False: only the first call counts
        self.text = ""  # everything generated so far
        self.sent = 0  # characters of `text` already sent as content
        self.plain = False  # decided: the answer is text, not a call (llama3 / mistral)

    def read(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole answer; no calls: the text is the content."""
        try:
            if self.forced:
                calls, content = parse_forced(text, self.names, self.named), None
            else:
                content, calls = parse_calls(text, self.fmt, self.names)
        except ValueError:
            return text, []
        if self.fmt.startswith("mistral"):  # Mistral's templates take 9 letters and digits
            for c in calls:
                c.id = uuid.uuid4().hex[:MISTRAL_ID]
        return content, calls if self.parallel else calls[:1]

    def feed(self, piece: str) -> str:
        """The part of the text so far that can go out as content now (never a call's start)."""
        self.text += piece
        safe = len(self.text) if self.plain else self._safe_end()
        out, self.sent = self.text[self.sent : max(safe, self.sent)], max(safe, self.sent)
        return out

    def _safe_end(self) -> int:
        """How far the text is surely content: before any marker, a marker's possible start,
        and the whitespace in front of them (content is sent without its trailing spaces);
        Llama 3's calls start the answer, so an answer that starts otherwise is text."""
        text = self.text
        if self.forced:
            return 0
        head = text.lstrip()
        if self.fmt == "llama3_json":  # a call starts the answer, or there is none
            if not head or head[0] == "{" or PYTHON_TAG.startswith(head[: len(PYTHON_TAG)]):
                return 0
            self.plain = True
            return len(text)
        if self.fmt == "mistral_args":
            return len(text[: self._args_hold(text)].rstrip())
        if self.fmt == "mistral" and head.startswith("[") and not head.startswith(MISTRAL_TAG):
            if not MISTRAL_TAG.startswith(head[: len(MISTRAL_TAG)]):
                return 0  # a bare array of calls (the tag was a special token, not decoded)
        marker = HERMES_OPEN if self.fmt == "hermes" else MISTRAL_TAG
        found = text.find(marker)
        end = found if found >= 0 else len(text) - _partial(text, marker)
        return len(text[:end].rstrip())

    def _args_hold(self, text: str) -> int:
        """`mistral_args`: content ends where a call may start: a name right before `{` or a
        tag, the tag, or an end of the text that begins one of those."""
        base = self.sent  # what was sent held no call's start, nor the beginning of one
        rest = text[base:]
        starts = _call_starts(rest, self.names)
        if starts:
            return base + starts[0]
        ends = [_partial(rest, w) for w in (MISTRAL_TAG, *(n + "{" for n in self.names))]
        return len(text) - max(ends, default=0)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of a stream: (content not sent yet, the calls)."""
        content, calls = self.read(self.text)
        if not calls:
            return self.text[self.sent :], []
        rest = (content or "")[self.sent :]
        return rest, calls


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def call_deltas(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """The `delta`s that stream calls: each call's index, id, type and name, then its
    arguments (the openai SDK's stream accumulator joins them)."""
    out: list[dict[str, Any]] = []
    for i, c in enumerate(calls):
        head = {"index": i, "id": c.id, "type": "function"}
        out.append({"tool_calls": [head | {"function": {"name": c.name, "arguments": ""}}]})
        out.append({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]})
    return out


__all__ = [
    "ToolCall",
    "ToolFormat",
    "ToolReader",
    "tool_format",
    "parse_calls",
    "parse_forced",
    "call_deltas",
    "HERMES_OPEN",
    "HERMES_CLOSE",
    "PYTHON_TAG",
    "MISTRAL_TAG",
    "ARGS_TAG",
    "MISTRAL_ID",
]
