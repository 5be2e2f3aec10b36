"""One elementwise op declaration, named as asked (for the refused op sets)."""

from __future__ import annotations

from llmir_core.dialects.opdef import InferCtx, OpDef, Operand
from llmir_core.dialects.shapes import float_tensor
from llmir_core.ir.types import Type


def _same(ctx: InferCtx) -> list[Type]:
    return [float_tensor(ctx, 0, "x")]


def identity_op(name: str) -> OpDef:
    return OpDef(
        name=name,
        summary="x, unchanged.",
        operands=(Operand("x", kind="float"),),
        attrs=(),
        infer=_same,
        reference=lambda a, at: a[0].copy(),
        no_smt="a test op",
        verifies="x is a float tensor.",
    )
