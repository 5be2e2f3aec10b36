"""Parse JSON and remember where each value sits, so errors can name a line.

`json.loads` checks the syntax (its errors carry a line already); this second, small parser
walks the same text and records the 1-based line and column of every object member (at its
key) and array item, keyed by the path of keys and indices that leads to it. It also reports
duplicate keys, which `json.loads` silently merges.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

JsonPath = tuple[str | int, ...]

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}


@dataclass
class Located:
    """A parsed JSON document with a position for every path and any duplicate keys."""

    value: Any
    positions: dict[JsonPath, tuple[int, int]] = field(default_factory=dict)
    duplicates: list[JsonPath] = field(default_factory=list)

    def where(self, path: JsonPath) -> tuple[int, int]:
        """Position of `path`, or of its nearest ancestor that has one."""
        while path not in self.positions and path:
            path = path[:-1]
        return self.positions.get(path, (1, 1))


class JsonSyntaxError(ValueError):
    def __init__(self, message: str, line: int, col: int) -> None:
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


MAX_DEPTH = 128  # nesting no index needs; deeper text would exhaust Python's recursion limit
_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)


def too_deep(text: str, limit: int = MAX_DEPTH) -> int | None:
    """Offset of the first bracket that opens more than `limit` levels, if any (strings skipped)."""
    depth = 0
    for m in _STRUCTURE.finditer(text):
        ch = m.group()
        if ch in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif ch in "]}":
            depth -= 1
    return None


class _Constant(ValueError):
    def __init__(self, word: str) -> None:
        super().__init__(word)
        self.word = word


def _no_constant(word: str) -> Any:
    raise _Constant(word)


def parse(text: str) -> Located:
    """Parse `text`; raise JsonSyntaxError (with line and column) when it is not JSON."""
    deep = too_deep(text)
    if deep is not None:
        line = text.count("\n", 0, deep) + 1
        raise JsonSyntaxError(
            f"nested deeper than {MAX_DEPTH} levels",
            line,
            deep - (text.rfind("\n", 0, deep) + 1) + 1,
        )
    try:
        json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(exc.msg, exc.lineno, exc.colno) from None
    except _Constant as exc:  # NaN / Infinity: Python's extension, not JSON
        at = text.find(exc.word)
        line = text.count("\n", 0, at) + 1
        raise JsonSyntaxError(
            f"{exc.word} is not valid JSON", line, at - (text.rfind("\n", 0, at) + 1) + 1
        ) from None
    walker = _Walker(text)
    _, value = walker.value_at(0, ())
    return Located(value=value, positions=walker.positions, duplicates=walker.duplicates)


class _Walker:
    """Recursive descent over text already known to be valid JSON."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.positions: dict[JsonPath, tuple[int, int]] = {}
        self.duplicates: list[JsonPath] = []
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def pos(self, index: int) -> tuple[int, int]:
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= index:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, index - self.line_starts[lo] + 1

    def skip(self, i: int) -> int:
        match = _WS.match(self.text, i)
        return match.end() if match else i

    def value_at(self, i: int, path: JsonPath) -> tuple[int, Any]:
        i = self.skip(i)
        self.positions.setdefault(path, self.pos(i))
        ch = self.text[i]
        if ch == "{":
            return self._object(i + 1, path)
        if ch == "[":
            return self._array(i + 1, path)
        if ch == '"':
            s, end = json.decoder.scanstring(self.text, i + 1)  # type: ignore[attr-defined]
            return end, s
        for word, literal in _LITERALS.items():
            if self.text.startswith(word, i):
                return i + len(word), literal
        match = _NUMBER.match(self.text, i)
        assert match, "json.loads accepted the text, so a number must be here"
        return match.end(), json.loads(match.group())

    def _object(self, i: int, path: JsonPath) -> tuple[int, dict[str, Any]]:
        out: dict[str, Any] = {}
        i = self.skip(i)
        if self.text[i] == "}":
            return i + 1, out
        while True:
            i = self.skip(i)
            key_pos = self.pos(i)
            key, i = json.decoder.scanstring(self.text, i + 1)  # type: ignore[attr-defined]
            child = (*path, key)
            if key in out:
                self.duplicates.append(child)
            self.positions[child] = key_pos
            i = self.skip(i) + 1  # the colon
            i, out[key] = self.value_at(i, child)
            i = self.skip(i)
            if self.text[i] == "}":
                return i + 1, out
            i += 1  # the comma

    def _array(self, i: int, path: JsonPath) -> tuple[int, list[Any]]:
        out: list[Any] = []
        i = self.skip(i)
        if self.text[i] == "]":
            return i + 1, out
        while True:
            i, item = self.value_at(i, (*path, len(out)))
            out.append(item)
            i = self.skip(i)
            if self.text[i] == "]":
                return i + 1, out
            i += 1
