"""merge-qkv: three matmuls of one activation by [out, in] weights become one matmul by the
concatenated weight, split into the three results (the Q/K/V projection merge).

Rewrite: `x @ Wq^T, x @ Wk^T, x @ Wv^T` -> `split(x @ concat(Wq, Wk, Wv)^T, axis=-1)`;
it applies the proved rules merge-qkv-q/-k/-v, one per output, and logs all three.
Invariant: each of the three values is unchanged; the weights are concatenated along axis 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Function, Module, Op
from llmir_core.ir.types import TensorType
from llmir_core.rewrite.library import RULES, is_proved
from llmir_core.rewrite.rule import RuleInstance, value_loc

from .base import PassContext, erase_dead, replace_uses, scratch_builder


def _candidate(op: Op) -> bool:
    if op.name != "core.matmul" or op.attrs.get("transpose_a") or not op.attrs.get("transpose_b"):
        return False
    w = op.operands[1].type
    return isinstance(w, TensorType) and w.rank == 2 and w.static_shape() is not None


@dataclass(frozen=True)
class MergeQkv:
    name: ClassVar[str] = "merge-qkv"
    summary: ClassVar[str] = "merge three projections of one activation into one matmul + split"

    def run(self, module: Module, ctx: PassContext) -> bool:
        rules = [RULES[f"merge-qkv-{k}"] for k in "qkv"]
        if not ctx.allow_unproved and not all(is_proved(r) for r in rules):
            return False
        if get_op("core.concat") is None or get_op("core.split") is None:
            return False
        changed = False
        for fn in module.functions:
            while self._merge_one(fn, ctx):
                changed = True
        return changed

    def _merge_one(self, fn: Function, ctx: PassContext) -> bool:
        pos = {id(o): i for i, o in enumerate(fn.ops)}
        groups: dict[tuple[int, object], list[Op]] = {}
        for op in fn.ops:
            if _candidate(op):
                w = op.operands[1].type
                assert isinstance(w, TensorType)
                groups.setdefault((id(op.operands[0]), (w.shape[1], w.dtype)), []).append(op)
        for group in groups.values():
            if len(group) < 3:
                continue
            trio = group[:3]
            first = pos[id(trio[0])]
            ws = [o.operands[1] for o in trio]
            late = [w for w in ws if w.owner is not None and pos[id(w.owner)] > first]
            if late:
                ctx.rejected(self.name, trio[0].results[0],
                             f"weight %{late[0].name} is defined after the first projection")
                continue
            self._rewrite(fn, ctx, trio, first)
            return True
        return False

    def _rewrite(self, fn: Function, ctx: PassContext, trio: list[Op], at: int) -> None:
        x = trio[0].operands[0]
        ws = [o.operands[1] for o in trio]
        sizes = tuple(w.type.shape[0] for w in ws)  # type: ignore[union-attr]
        b, new_ops = scratch_builder(fn, trio[0].origin)
        cat = b.op("core.concat", *ws, axis=0)
        mm = b.op("core.matmul", x, cat, transpose_b=True)
        parts = b.create("core.split", [mm], {"axis": -1, "sizes": sizes}).results
        fn.ops[at:at] = new_ops
        for key, op, part in zip("qkv", trio, parts):
            old = op.results[0]
            loc = value_loc(old)
            replace_uses(fn, old, part)
            name = old.name
            old.name = name + ".dead"
            part.name = name
            ctx.applied(f"merge-qkv-{key}", part, f"slice {key} of %{mm.name}")
            ctx.instances.append(RuleInstance(
                f"merge-qkv-{key}", name, name,
                {"x": x.name, "wq": ws[0].name, "wk": ws[1].name, "wv": ws[2].name}, {},
                {"sizes": sizes}, loc))
        erase_dead(fn, trio)
