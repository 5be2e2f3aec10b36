"""Ops are declared as data: one `OpDef` per op.

An OpDef holds the op's name, its operand/result/attribute signature, a one-sentence statement of
what its verifier checks, a shape/dtype rule over symbolic dims (`infer`), the numpy reference
semantics (`reference`), and for composite ops a decomposition into simpler ops (`decompose`).
Every docstring-style `example` is parsed and verified by the test-suite, and `docs/spec.md`'s op
reference is generated from these entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from llmir_core.ir.types import Type

if TYPE_CHECKING:
    from llmir_core.builder import Builder
    from llmir_core.ir.core import Value


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


class OpVerifyError(Exception):
    """Raised by shape rules: the op is ill-typed; the message says why (one line)."""


@dataclass(frozen=True)
class Operand:
    name: str
    variadic: bool = False  # zero or more (only the last operand)
    optional: bool = False  # may be absent (only trailing operands)
    doc: str = ""


@dataclass(frozen=True)
class Attr:
    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple[Any, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


InferFn = Callable[["InferCtx"], list[Type]]
RefFn = Callable[[list[np.ndarray], dict[str, Any]], "np.ndarray | list[np.ndarray]"]
DecomposeFn = Callable[["Builder", list["Value"], dict[str, Any]], list["Value"]]


@dataclass(frozen=True)
class OpDef:
    name: str
    summary: str
    operands: tuple[Operand, ...]
    attrs: tuple[Attr, ...]
    infer: InferFn
    reference: RefFn | None
    verifies: str  # one sentence: what the verifier checks for this op
    results: tuple[str, ...] = ("result",)
    variadic_results: bool = False
    decompose: DecomposeFn | None = None
    example: str = ""
    effects: bool = False  # has an effect beyond its results (never dead-code eliminated)
    traits: frozenset[str] = field(default_factory=frozenset)

    @property
    def dialect(self) -> str:
        return self.name.split(".", 1)[0]

    def attr(self, name: str) -> Attr | None:
        for a in self.attrs:
            if a.name == name:
                return a
        return None

    def with_defaults(self, attrs: dict[str, Any]) -> dict[str, Any]:
        out = {a.name: a.default for a in self.attrs if not a.required}
        out.update(attrs)
        return out

    def operand_range(self) -> tuple[int, int | None]:
        """(min, max) operand count; max None when variadic."""
        lo = sum(1 for o in self.operands if not o.optional and not o.variadic)
        if any(o.variadic for o in self.operands):
            return lo, None
        return lo, len(self.operands)


class InferCtx:
    """What a shape rule sees: the operand types and the attributes (defaults filled)."""

    __slots__ = ("op", "types", "attrs", "num_results", "declared")

    def __init__(self, op: OpDef, types: Sequence[Type], attrs: dict[str, Any],
                 num_results: int | None = None, declared: Sequence[Type] | None = None) -> None:
        self.op = op
        self.types = list(types)
        self.attrs = attrs
        self.num_results = num_results
        # the result types written in the text (None when building): only ops whose result
        # cannot be computed from operands and attributes (core.weight) may read them
        self.declared = list(declared) if declared is not None else None

    def fail(self, message: str) -> OpVerifyError:
        return OpVerifyError(message)

    def __getitem__(self, key: str) -> Any:
        return self.attrs[key]
