"""Building IR in code: frontends, passes and decompositions append ops with inferred types."""

from __future__ import annotations

from typing import Any

from llmir_core.dialects.opdef import InferCtx
from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import Type


class Builder:
    """Appends ops to a function, inferring result types from the op declarations."""

    def __init__(self, fn: Function, ops: list[Op] | None = None, prefix: str = "v") -> None:
        self.fn = fn
        self.ops = fn.ops if ops is None else ops
        self.prefix = prefix
        self.origin: str | None = None  # recorded on every new op
        self._used = {v.name for v in fn.values()}
        self._counter = 0

    def fresh(self, hint: str | None = None) -> str:
        base = hint or self.prefix
        base = "".join(c if c.isalnum() or c in "_." else "_" for c in base) or self.prefix
        if base not in self._used and not base[0].isdigit():
            self._used.add(base)
            return base
        while True:
            self._counter += 1
            name = f"{base}{self._counter}" if hint else f"{self.prefix}{self._counter}"
            if name not in self._used:
                self._used.add(name)
                return name

    def infer(
        self,
        name: str,
        operands: list[Value],
        attrs: dict[str, Any],
        num_results: int | None = None,
        declared: list[Type] | None = None,
    ) -> list[Type]:
        opdef = get_op(name)
        if opdef is None:
            raise KeyError(f"unknown op {name}")
        ctx = InferCtx(
            opdef, [v.type for v in operands], opdef.with_defaults(attrs), num_results, declared
        )
        return opdef.run_infer(ctx)

    def create(
        self,
        name: str,
        operands: list[Value],
        attrs: dict[str, Any] | None = None,
        result_types: list[Type] | None = None,
        names: list[str] | None = None,
        origin: str | None = None,
    ) -> Op:
        attrs = dict(attrs or {})
        types = (
            self.infer(name, operands, attrs, declared=result_types)
            if result_types is None
            else result_types
        )
        rnames = [self.fresh(n) for n in names] if names else [self.fresh() for _ in types]
        op = Op(name, operands, types, attrs, rnames, origin or self.origin)
        self.ops.append(op)
        return op

    def op(self, name: str, *operands: Value, name_hint: str | None = None, **attrs: Any) -> Value:
        """Create a single-result op and return its result."""
        op = self.create(name, list(operands), attrs, names=[name_hint] if name_hint else None)
        return op.results[0]

    def arg(self, name: str, type_: Type) -> Value:
        v = Value(self.fresh(name), type_)
        self.fn.args.append(v)
        return v

    def ret(self, *values: Value) -> None:
        self.fn.outputs = list(values)


def new_module(name: str = "module", dialects: tuple[str, ...] = ("core",)) -> Module:
    return Module(name, [], {"llmir.dialects": tuple(dialects)})
