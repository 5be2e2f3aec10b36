"""Terms: the pattern and replacement language of rewrite rules.

A term is a tree over three leaf kinds and one node kind:

- `V("x")`   a tensor variable: matches any value and binds it;
- `C("eps")` a scalar constant variable: matches a `core.constant` whose elements are all equal
             and binds that number (in proofs it is a symbolic real);
- `A("name")` inside an attribute dict: matches any attribute value and binds it;
- `T(op, args, attrs, result)` an op application; `attrs` lists only the attributes the pattern
             cares about (compared with defaults filled in), literal or `A(...)`.

The same term drives four consumers: matching against the IR (`match`), building the replacement
(`build`), the element-level SMT encoding (`llmir_core.smt`) and the numpy replay of
counterexamples (`instantiate_function`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from llmir_core.dialects.registry import get_op
from llmir_core.ir.attrs import DenseAttr, attr_equal
from llmir_core.ir.core import Op, Value
from llmir_core.ir.types import DType, TensorType

BIG = 2**62  # a slice end at or past this means "to the end" (ONNX uses INT64_MAX)


@dataclass(frozen=True)
class V:
    name: str


@dataclass(frozen=True)
class C:
    name: str


@dataclass(frozen=True)
class A:
    name: str


@dataclass(frozen=True)
class K:
    """A literal constant: matches a splat `core.constant` equal to `value` (relative 1e-6)."""

    value: float


@dataclass(frozen=True)
class T:
    op: str
    args: tuple[Term, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)
    result: int = 0

    def __hash__(self) -> int:
        return hash((self.op, self.args, self.result))


Term = Union[V, C, K, T]


def t(op: str, *args: Term, result: int = 0, **attrs: Any) -> T:
    """Shorthand: `t("core.add", V("x"), C("c"))`."""
    return T(op, tuple(args), dict(attrs), result)


@dataclass
class Match:
    """What a pattern bound: tensor values, constants, attributes, and the ops it covered."""

    values: dict[str, Value] = field(default_factory=dict)
    consts: dict[str, float] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)  # root first

    @property
    def root(self) -> Op:
        return self.ops[0]


def splat_value(v: Value) -> float | None:
    """The number a `core.constant` with all-equal elements holds, else None."""
    op = v.owner
    if op is None or op.name != "core.constant":
        return None
    d = op.attrs.get("value")
    if not isinstance(d, DenseAttr) or d.array.size == 0:
        return None
    flat = d.array.reshape(-1)
    if d.array.dtype.kind not in "fiu" or not (flat == flat[0]).all():
        return None
    if d.array.dtype.kind == "f":
        return float(str(flat[0]))  # the shortest decimal that round-trips in the constant's dtype
    return float(flat[0])


def _attr_defaults(op: Op) -> dict[str, Any]:
    od = get_op(op.name)
    return od.with_defaults(op.attrs) if od is not None else dict(op.attrs)


def match(term: Term, value: Value, m: Match | None = None) -> Match | None:
    """Match `term` against the value's defining ops; None when it does not match."""
    m = m if m is not None else Match()
    if isinstance(term, V):
        bound = m.values.get(term.name)
        if bound is not None:
            return m if bound is value else None
        m.values[term.name] = value
        return m
    if isinstance(term, K):
        c = splat_value(value)
        if c is None or abs(c - term.value) > 1e-6 * max(1.0, abs(term.value)):
            return None
        return m
    if isinstance(term, C):
        c = splat_value(value)
        if c is None:
            return None
        if term.name in m.consts:
            return m if m.consts[term.name] == c else None
        m.consts[term.name] = c
        m.values.setdefault("$" + term.name, value)
        return m
    op = value.owner
    if op is None or op.name != term.op or value.index != term.result:
        return None
    if len(op.operands) != len(term.args):
        return None
    attrs = _attr_defaults(op)
    for k, want in term.attrs.items():
        have = attrs.get(k)
        if isinstance(want, A):
            if want.name in m.attrs and not attr_equal(m.attrs[want.name], have):
                return None
            m.attrs[want.name] = have
        elif not attr_equal(_norm(want), _norm(have)):
            return None
    m.ops.append(op)
    for sub, operand in zip(term.args, op.operands):
        if match(sub, operand, m) is None:
            return None
    return m


def _norm(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    return v


def subst_attrs(attrs: Mapping[str, Any], bound: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if isinstance(v, A):
            out[k] = bound[v.name]
        elif isinstance(v, list):
            out[k] = tuple(v)
        else:
            out[k] = v
    return out


def build(
    term: Term, m: Match, b: Any, const_dtype: DType = DType.f32, cache: dict[Any, Op] | None = None
) -> Value:
    """Build `term` with builder `b`, taking leaves from the match. Ops are shared through
    `cache` by name, operands and attributes, so terms that differ only in the result they
    take (the results of one fused op, the parts of one split) build one op."""
    cache = {} if cache is None else cache
    if isinstance(term, V):
        return m.values[term.name]
    if isinstance(term, K):
        return b.op(
            "core.constant", value=DenseAttr(np.array(term.value, dtype=const_dtype.to_numpy()))
        )
    if isinstance(term, C):
        existing = m.values.get("$" + term.name)
        if existing is not None:
            return existing
        arr = np.array(m.consts[term.name], dtype=const_dtype.to_numpy())
        return b.op("core.constant", value=DenseAttr(arr))
    args = [build(a, m, b, const_dtype, cache) for a in term.args]
    attrs = subst_attrs(term.attrs, {**m.consts, **m.attrs})
    key = (term.op, tuple(id(a) for a in args), repr(sorted(attrs.items())))
    op = cache.get(key)
    if op is None:
        op = cache[key] = b.create(term.op, args, attrs)
    return op.results[term.result]


def leaves(term: Term, acc: dict[str, Term] | None = None) -> dict[str, Term]:
    """Every V and C leaf of a term, by name, in first-seen order."""
    acc = {} if acc is None else acc
    if isinstance(term, (V, C)):
        acc.setdefault(term.name, term)
    elif isinstance(term, T):
        for a in term.args:
            leaves(a, acc)
    return acc


def ops_of(term: Term, acc: list[str] | None = None) -> list[str]:
    acc = [] if acc is None else acc
    if isinstance(term, T):
        acc.append(term.op)
        for a in term.args:
            ops_of(a, acc)
    return acc


def fmt_term(term: Term) -> str:
    """A short readable form: `core.add(x, $c)`."""
    if isinstance(term, V):
        return term.name
    if isinstance(term, C):
        return "$" + term.name
    if isinstance(term, K):
        return repr(term.value)
    name = term.op.split(".", 1)[1]
    args = ", ".join(fmt_term(a) for a in term.args)
    at = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in term.attrs.items())
    res = f"#{term.result}" if term.result else ""
    return f"{name}{res}({args}{'; ' + at if at else ''})"


def _fmt_attr(v: Any) -> str:
    if isinstance(v, A):
        return "@" + v.name
    return str(v)


TensorTypeFn = Callable[[dict[str, int]], TensorType]
