"""merge-qkv: three matmuls of one activation by [out, in] weights become one matmul by the
concatenated weight, split into the three results (the Q/K/V projection merge).

Rewrite: `x @ Wq^T, x @ Wk^T, x @ Wv^T` -> `split(x @ concat(Wq, Wk, Wv)^T, axis=-1)`;
it applies the proved rules merge-qkv-q/-k/-v, one per output, as one rewrite of the engine
(which hoists weights defined after the first projection, as importers emit them). The three
are the first three projections of x (in program order) by matrices of one input width and dtype;
weights stored quantized (read through llm.dequantize) are left alone, since their concatenation
would be a new f32 tensor.
Invariant: each of the three values is unchanged; the weights are concatenated along axis 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import QuantType, TensorType
from llmir_core.rewrite.library import RULES
from llmir_core.rewrite.terms import Match

from .base import PassContext
from .rewriting import Part, rewrite


def _candidate(op: Op) -> bool:
    if op.name != "core.matmul" or op.attrs.get("transpose_a") or not op.attrs.get("transpose_b"):
        return False
    w = op.operands[1].type
    return isinstance(w, TensorType) and w.rank == 2 and w.static_shape() is not None


def _stored_quantized(w: Value) -> QuantType | None:
    """The packed format of a weight read through llm.dequantize (GGUF blocks, nbits codes)."""
    op = w.owner
    if (
        op is not None
        and op.name == "llm.dequantize"
        and isinstance(op.operands[0].type, TensorType)
    ):
        q = op.operands[0].type.dtype
        return q if isinstance(q, QuantType) else None
    return None


@dataclass(frozen=True)
class MergeQkv:
    name: ClassVar[str] = "merge-qkv"
    summary: ClassVar[str] = "merge three projections of one activation into one matmul + split"

    def run(self, module: Module, ctx: PassContext) -> bool:
        changed = False
        for fn in module.functions:
            tried: set[int] = set()
            while self._merge_one(fn, ctx, tried):
                changed = True
        return changed

    def _merge_one(self, fn: Function, ctx: PassContext, tried: set[int]) -> bool:
        groups: dict[tuple[int, object], list[Op]] = {}
        for op in fn.ops:
            if _candidate(op):
                w = op.operands[1].type
                assert isinstance(w, TensorType)
                groups.setdefault((id(op.operands[0]), (w.shape[1], w.dtype)), []).append(op)
        for group in groups.values():
            if len(group) < 3 or id(group[0]) in tried:
                continue
            trio = group[:3]
            tried.add(id(trio[0]))
            ws = [o.operands[1] for o in trio]
            packed = next(((w, q) for w in ws if (q := _stored_quantized(w)) is not None), None)
            if packed is not None:
                ctx.rejected(
                    "merge-qkv-q",
                    trio[0].results[0],
                    f"weight %{packed[0].name} is stored as {packed[1]}: the merged weight "
                    "would be stored in f32 (backends pack quantized Q/K/V themselves)",
                )
                continue
            seed = Match(
                values={"x": trio[0].operands[0], "wq": ws[0], "wk": ws[1], "wv": ws[2]},
                attrs={"sizes": tuple(w.type.shape[0] for w in ws)},  # type: ignore[union-attr]
            )
            mm = f"x @ concat(%{ws[0].name}, %{ws[1].name}, %{ws[2].name})^T"
            parts = [
                Part(RULES[f"merge-qkv-{k}"], o.results[0], detail=f"slice {k} of {mm}")
                for k, o in zip("qkv", trio)
            ]
            if rewrite(fn, ctx, parts, seed) is None:
                return True
        return False
