"""cse: common subexpression elimination.

Rewrite: a pure op with the same name, operands, attributes and result types as an earlier op
is replaced by the earlier op's results. Ops with effects are never merged.
Invariant: values are unchanged (two identical pure ops compute the same thing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmir_core.ir.core import Module, Op
from llmir_core.ir.printer import format_attr_dict

from .base import PassContext, is_pure, replace_many


def op_key(op: Op) -> tuple[Any, ...]:
    return (
        op.name,
        tuple(id(v) for v in op.operands),
        format_attr_dict(op.attrs),
        tuple(str(r.type) for r in op.results),
    )


@dataclass(frozen=True)
class Cse:
    name: ClassVar[str] = "cse"
    summary: ClassVar[str] = "merge identical pure ops"

    def run(self, module: Module, ctx: PassContext) -> bool:
        changed = False
        for fn in module.functions:
            seen: dict[tuple[Any, ...], Op] = {}
            mapping: dict[int, Any] = {}
            keep: list[Op] = []
            for op in fn.ops:
                if mapping:
                    op.operands = [mapping.get(id(v), v) for v in op.operands]
                if not is_pure(op):
                    keep.append(op)
                    continue
                key = op_key(op)
                first = seen.get(key)
                if first is None:
                    seen[key] = op
                    keep.append(op)
                    continue
                for r, f in zip(op.results, first.results):
                    mapping[id(r)] = f
                ctx.applied(self.name, op.results[0], f"same as %{first.results[0].name}")
                changed = True
            fn.ops = keep
            replace_many(fn, mapping)
        return changed
