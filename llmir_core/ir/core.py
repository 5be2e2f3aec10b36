"""The IR's object model: Module -> Function -> Op, with SSA Values.

Every op is the same kind of object (name, operands, results, attributes, origin); what an op
*means* is declared in `llmir_core.dialects`. Source positions from the parser (`pos`) are kept
for diagnostics but are not part of equality; the frontend origin (`origin`: an ONNX node name,
an HF module path, a GGUF tensor name) is printed and compared.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llmir_core import SPEC_VERSION
from llmir_core.errors import SourcePos

from .attrs import attr_equal
from .types import Type


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (re-enabled after, if it was on).

    Parsing, verifying and printing a large module allocate many small container objects and
    free almost none; the collector's passes over them are pure cost (a third of the parse time
    of a 20,000-op module). Nothing these functions build is cyclic garbage.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Value:
    """An SSA value: a function argument (owner None) or an op result."""

    __slots__ = ("name", "type", "owner", "index", "pos")

    def __init__(
        self,
        name: str,
        type_: Type,
        owner: Op | None = None,
        index: int = 0,
        pos: SourcePos | None = None,
    ) -> None:
        self.name = name
        self.type = type_
        self.owner = owner
        self.index = index
        self.pos = pos

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Op:
    """One operation: `%r = dialect.op %a, %b {attrs} : (in) -> out loc("origin")`."""

    __slots__ = ("name", "operands", "results", "attrs", "origin", "pos")

    def __init__(
        self,
        name: str,
        operands: list[Value],
        result_types: list[Type],
        attrs: dict[str, Any] | None = None,
        result_names: list[str] | None = None,
        origin: str | None = None,
        pos: SourcePos | None = None,
    ) -> None:
        self.name = name
        self.operands = list(operands)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.origin = origin
        self.pos = pos
        names = result_names or [""] * len(result_types)
        self.results = [Value(n, t, self, i) for i, (n, t) in enumerate(zip(names, result_types))]

    @property
    def result(self) -> Value:
        return self.results[0]

    @property
    def dialect(self) -> str:
        return self.name.split(".", 1)[0]

    def __repr__(self) -> str:
        return f"<Op {self.name} at {self.pos}>"


class Function:
    """A function: typed arguments, a straight-line list of ops, and returned values."""

    def __init__(
        self,
        name: str,
        args: list[Value],
        ops: list[Op] | None = None,
        outputs: list[Value] | None = None,
        attrs: dict[str, Any] | None = None,
        pos: SourcePos | None = None,
    ) -> None:
        self.name = name
        self.args = args
        self.ops: list[Op] = ops or []
        self.outputs: list[Value] = outputs or []
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.pos = pos
        self.return_pos: SourcePos | None = None

    @property
    def output_types(self) -> list[Type]:
        return [v.type for v in self.outputs]

    def values(self) -> Iterator[Value]:
        yield from self.args
        for op in self.ops:
            yield from op.results


class Module:
    """A module: a name, header attributes (spec version, dialects, extensions), functions."""

    def __init__(
        self,
        name: str = "module",
        functions: list[Function] | None = None,
        attrs: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> None:
        self.name = name
        self.functions: list[Function] = functions or []
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.attrs.setdefault("llmir.version", SPEC_VERSION)
        self.source = source  # the file it was parsed from, for diagnostics

    def function(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def main(self) -> Function:
        for f in self.functions:
            if f.name == "main":
                return f
        return self.functions[0]

    def op_count(self) -> int:
        return sum(len(f.ops) for f in self.functions)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Module):
            return NotImplemented
        return modules_equal(self, other)

    __hash__ = None  # type: ignore[assignment]


def _values_equal(a: Value, b: Value) -> bool:
    return a.name == b.name and a.type == b.type


def functions_equal(a: Function, b: Function) -> bool:
    if a.name != b.name or len(a.args) != len(b.args) or len(a.ops) != len(b.ops):
        return False
    if not attr_equal(a.attrs, b.attrs):
        return False
    if not all(_values_equal(x, y) for x, y in zip(a.args, b.args)):
        return False
    for x, y in zip(a.ops, b.ops):
        if (
            x.name != y.name
            or x.origin != y.origin
            or len(x.operands) != len(y.operands)
            or len(x.results) != len(y.results)
        ):
            return False
        if not all(_values_equal(p, q) for p, q in zip(x.operands, y.operands)):
            return False
        if not all(_values_equal(p, q) for p, q in zip(x.results, y.results)):
            return False
        if not attr_equal(x.attrs, y.attrs):
            return False
    return len(a.outputs) == len(b.outputs) and all(
        _values_equal(x, y) for x, y in zip(a.outputs, b.outputs)
    )


def modules_equal(a: Module, b: Module) -> bool:
    return (
        a.name == b.name
        and attr_equal(a.attrs, b.attrs)
        and len(a.functions) == len(b.functions)
        and all(functions_equal(x, y) for x, y in zip(a.functions, b.functions))
    )
