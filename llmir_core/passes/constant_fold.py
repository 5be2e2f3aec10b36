"""constant-fold: an op whose operands are all `core.constant` is evaluated and becomes one.

Rewrite: `op(constant, ...)` -> `core.constant` holding the reference interpreter's result.
Only pure ops with a reference, and only results of at most `max_elements` elements (folding a
broadcast must not blow up the file). Invariant: the value is exactly the reference's (the
interpreter is the oracle); the logged instance `constant-fold` is justified by evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from llmir_core.dialects.registry import get_op
from llmir_core.interp import Interpreter
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Module, Op
from llmir_core.ir.types import TensorType
from llmir_core.rewrite.rule import RuleInstance, value_loc

from .base import PassContext, erase_dead, replace_uses, scratch_builder


@dataclass(frozen=True)
class ConstantFold:
    name: ClassVar[str] = "constant-fold"
    summary: ClassVar[str] = "evaluate ops whose operands are all constants"
    max_elements: int = 4096

    def _foldable(self, op: Op) -> bool:
        od = get_op(op.name)
        if od is None or od.effects or od.reference is None or op.name == "core.constant":
            return False
        if not op.operands or any(
            v.owner is None or v.owner.name != "core.constant" for v in op.operands
        ):
            return False
        for r in op.results:
            shape = r.type.static_shape() if isinstance(r.type, TensorType) else None
            if shape is None:
                return False
            if int(np.prod(shape)) > self.max_elements:
                return False
        return True

    def run(self, module: Module, ctx: PassContext) -> bool:
        changed = False
        interp = Interpreter(module)
        for fn in module.functions:
            i = 0
            folded = []
            while i < len(fn.ops):
                op = fn.ops[i]
                if not self._foldable(op):
                    i += 1
                    continue
                args = [np.asarray(v.owner.attrs["value"].array) for v in op.operands]  # type: ignore[union-attr]
                try:
                    outs = interp.eval_op(op, args, {})
                except Exception as exc:  # noqa: BLE001 - report, do not fold
                    ctx.rejected(self.name, op.results[0], f"evaluation failed: {exc}")
                    i += 1
                    continue
                b, new_ops = scratch_builder(fn, op.origin)
                for r, val in zip(op.results, outs):
                    arr = np.asarray(val)
                    assert isinstance(r.type, TensorType)
                    c = b.create(
                        "core.constant",
                        [],
                        {"value": DenseAttr(arr, r.type)},
                        result_types=[r.type],
                    ).results[0]
                    loc = value_loc(r)
                    replace_uses(fn, r, c)
                    old = r.name
                    r.name = old + ".dead"
                    c.name = old
                    ctx.applied(self.name, c, f"{op.name} of constants")
                    ctx.instances.append(
                        RuleInstance("constant-fold", old, c.name, {}, {}, {}, loc)
                    )
                fn.ops[i:i] = new_ops
                i += len(new_ops) + 1
                folded.append(op)
                changed = True
            if folded:
                erase_dead(fn, folded)
        return changed
