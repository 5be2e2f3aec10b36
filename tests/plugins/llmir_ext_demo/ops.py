"""The `ext` op set: ops a baseline runtime need not know, each with a fallback decomposition
into core ops (what a runtime without a kernel for the op runs, and what translation validation
takes as the op's meaning)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.dialects.opdef import Attr, InferCtx, OpDef, Operand
from llmir_core.dialects.registry import register, register_dialect
from llmir_core.dialects.shapes import float_tensor
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.types import TensorType, Type, numpy_dtype

VERSION = 1  # of the op set: its ops and their meaning
register_dialect("ext", f"standard extension ops with fallback decompositions (version {VERSION})")


def _same_as_x(ctx: InferCtx) -> list[Type]:
    return [float_tensor(ctx, 0, "x")]


def _scalar(b: Any, value: float, like: Any) -> Any:
    t = TensorType((), like.type.dtype)
    return b.op("core.constant", value=DenseAttr(np.array(value, numpy_dtype(t.dtype)), t))


def _swish_beta_ref(a: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x = a[0].astype(np.float64)
    return (x / (1.0 + np.exp(-at["beta"] * x))).astype(a[0].dtype)


def _swish_beta_dec(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    bx = b.op("core.mul", o[0], _scalar(b, at["beta"], o[0]))
    return [b.op("core.mul", o[0], b.op("core.sigmoid", bx))]


def _soft_clip_dec(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    bound = _scalar(b, at["bound"], o[0])
    return [b.op("core.mul", bound, b.op("core.tanh", b.op("core.div", o[0], bound)))]


register(
    OpDef(
        name="ext.swish_beta",
        summary="x * sigmoid(beta * x), elementwise (Swish with a fixed beta).",
        operands=(Operand("x", kind="float"),),
        attrs=(Attr("beta", "float", 1.0, "the slope inside the sigmoid"),),
        infer=_same_as_x,
        reference=_swish_beta_ref,
        decompose=_swish_beta_dec,
        no_smt="an extension op: its meaning is its decomposition",
        verifies="x is a float tensor; the result has its type.",
        traits=frozenset({"elementwise"}),
        example="%y = ext.swish_beta %x {beta = 1.5} : (tensor<?n x 8 x f32>) -> tensor<?n x 8 x f32>",
    ),
    OpDef(
        name="ext.soft_clip",
        summary="bound * tanh(x / bound), elementwise: x squashed into (-bound, bound).",
        operands=(Operand("x", kind="float"),),
        attrs=(Attr("bound", "float", 1.0, "the limit of the result's magnitude"),),
        infer=_same_as_x,
        reference=None,  # the decomposition is its meaning, and what the interpreter runs
        decompose=_soft_clip_dec,
        no_smt="an extension op: its meaning is its decomposition",
        verifies="x is a float tensor; the result has its type.",
        traits=frozenset({"elementwise"}),
        example="%y = ext.soft_clip %x {bound = 4.0} : (tensor<?n x 8 x f32>) -> tensor<?n x 8 x f32>",
    ),
)
