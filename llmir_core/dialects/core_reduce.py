"""The `core` dialect, part 3: reductions and softmax.

The reductions mean ONNX's ReduceSum/Mean/Max/Min/Prod (with the axes as an attribute; empty axes
reduce every axis; the `_dyn` forms take them as a run-time i64 tensor of static length) and softmax/log_softmax mean ONNX's opset-13 Softmax/LogSoftmax over one axis.
Floats are reduced in float64 and rounded once to the operand dtype. A reduction over no elements
gives ONNX's identities: 0 for sum, 1 for prod, the dtype's lowest value (-inf for floats) for max,
its highest (+inf) for min, and NaN for a float mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llmir_core.ir.dims import DYN
from llmir_core.ir.types import Type

from . import ranges
from .core_shape import _shape_operand, is_float_array, numeric_tensor, reduced_shape
from .opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError, encoding
from .registry import register
from .shapes import float_tensor, like, norm_axes, norm_axis

_X = (Operand("x"),)


def _axes(axes: tuple[int, ...], rank: int) -> list[int]:
    return norm_axes(axes, rank) if axes else list(range(rank))


def _infer_reduce(allow_bool: bool) -> Callable[[InferCtx], list[Type]]:
    def infer(ctx: InferCtx) -> list[Type]:
        x = numeric_tensor(ctx, 0, "x", allow_bool=allow_bool)
        return [like(x, reduced_shape(x.shape, _axes(ctx["axes"], x.rank), ctx["keepdims"]))]

    return infer


def _extreme(a: np.ndarray, lowest: bool) -> Any:
    """The identity of max (lowest=True) or min over a's dtype: -inf/+inf, the int bounds, False/True."""
    if a.dtype.kind == "f":
        return -np.inf if lowest else np.inf
    if a.dtype == np.bool_:
        return not lowest
    info = np.iinfo(a.dtype)
    return info.min if lowest else info.max


def _mean(a: np.ndarray, axes: tuple[int, ...], keep: bool, x: np.ndarray) -> np.ndarray:
    count = int(np.prod([x.shape[i] for i in axes]))
    if a.dtype.kind == "f":
        with np.errstate(invalid="ignore"):  # 0 / 0: the mean of no elements is NaN
            return np.asarray(np.sum(a, axis=axes, keepdims=keep) / np.float64(count))
    s = np.sum(a, axis=axes, keepdims=keep, dtype=np.int64)
    if not count:
        raise ValueError("integer mean over no elements")
    return np.asarray(
        np.sign(s) * (np.abs(s) // count)
    )  # integer division truncates toward zero, as onnxruntime does


def _ref_reduce(kind: str) -> Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]:
    def run(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        x = args[0]
        axes = tuple(_axes(attrs["axes"], x.ndim))
        keep = attrs["keepdims"]
        a = x.astype(np.float64) if is_float_array(x) else x
        if kind == "sum":
            r = np.sum(a, axis=axes, keepdims=keep, dtype=a.dtype)
        elif kind == "prod":
            r = np.prod(a, axis=axes, keepdims=keep, dtype=a.dtype)
        elif kind == "mean":
            r = _mean(a, axes, keep, x)
        elif kind == "max":
            r = np.max(a, axis=axes, keepdims=keep, initial=_extreme(a, lowest=True))
        else:
            r = np.min(a, axis=axes, keepdims=keep, initial=_extreme(a, lowest=False))
        return np.asarray(r).astype(x.dtype)

    return run


_REDUCE = {
    "sum": ("Sum", False),
    "mean": ("Mean (integers: truncated)", False),
    "max": ("Largest element", True),
    "min": ("Smallest element", True),
    "prod": ("Product", False),
}

for _kind, (_doc, _bool) in _REDUCE.items():
    register(
        OpDef(
            name=f"core.reduce_{_kind}",
            summary=f"{_doc} of x over `axes` (empty = all axes), keeping them as size 1 when keepdims.",
            operands=_X,
            attrs=(
                Attr("axes", "ints", (), doc="axes to reduce; empty = all"),
                Attr("keepdims", "bool", True),
            ),
            infer=_infer_reduce(_bool),
            reference=_ref_reduce(_kind),
            smt=encoding("core_smt", f"reduce_{_kind}"),
            interval={"sum": ranges.iv_reduce_sum, "prod": None}.get(_kind, ranges.iv_first),
            cost=ranges.cost_reduce(),
            verifies=f"x is {'numeric or bool' if _bool else 'numeric'} and axes are distinct and in range.",
            example=f"%y = core.reduce_{_kind} %x {{axes = [-1]}} : (tensor<?b x ?s x 576 x f32>) "
            "-> tensor<?b x ?s x 1 x f32>",
        )
    )


def _infer_reduce_dyn(allow_bool: bool) -> Callable[[InferCtx], list[Type]]:
    def infer(ctx: InferCtx) -> list[Type]:
        x = numeric_tensor(ctx, 0, "x", allow_bool=allow_bool)
        n = _shape_operand(ctx, 1, "axes")
        if n > x.rank:
            raise OpVerifyError(f"axes has {n} entries but x has rank {x.rank}")
        if n == 0:  # static: no axes = every axis (the frontend emits the static form instead)
            return [like(x, reduced_shape(x.shape, list(range(x.rank)), ctx["keepdims"]))]
        if ctx["keepdims"]:  # which dims become 1 is known only at run time
            return [like(x, [1 if d == 1 else DYN for d in x.shape])]
        return [like(x, [DYN] * (x.rank - n))]

    return infer


def _ref_reduce_dyn(kind: str) -> Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]:
    static = _ref_reduce(kind)

    def run(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        x = args[0]
        axes = [int(a) for a in np.asarray(args[1]).reshape(-1)]
        for a in axes:
            if not -x.ndim <= a < x.ndim:
                raise ValueError(f"axis {a} out of range for rank {x.ndim}")
        if len({a % x.ndim for a in axes}) != len(axes):
            raise ValueError(f"axes {axes} repeat an axis")
        return static([x], {"axes": tuple(axes), "keepdims": attrs["keepdims"]})

    return run


for _kind, (_doc, _bool) in _REDUCE.items():
    register(
        OpDef(
            name=f"core.reduce_{_kind}_dyn",
            summary=f"core.reduce_{_kind} with the axes given as a run-time 1-D i64 tensor of static, "
            "non-zero length (the result's rank is known; with keepdims its reduced sizes are `?`).",
            operands=(Operand("x"), Operand("axes")),
            attrs=(Attr("keepdims", "bool", True),),
            infer=_infer_reduce_dyn(_bool),
            reference=_ref_reduce_dyn(_kind),
            no_smt="its axes are an operand's values, so its result shape is not known from "
            "types and attributes",
            interval={"sum": None, "prod": None}.get(_kind, ranges.iv_first),
            cost=ranges.cost_reduce(),
            verifies="axes is a 1-D i64 tensor of static length at most x's rank; at run time its entries "
            "are distinct and in range.",
            example=f"%y = core.reduce_{_kind}_dyn %x, %a : (tensor<2x3x4xf32>, tensor<1xi64>) "
            "-> tensor<?x?x?xf32>",
        )
    )


def _infer_softmax(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1")
    norm_axis(ctx["axis"], x.rank)
    return [x]


def _ref_softmax(log: bool) -> Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]:
    def run(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        x = args[0]
        ax = attrs["axis"] % x.ndim
        a = x.astype(np.float64)
        shifted = a - np.max(a, axis=ax, keepdims=True, initial=-np.inf)  # stable: exp(<= 0)
        e = np.exp(shifted)
        s = np.sum(e, axis=ax, keepdims=True)
        return np.asarray(shifted - np.log(s) if log else e / s).astype(x.dtype)

    return run


for _name, _log in (("softmax", False), ("log_softmax", True)):
    register(
        OpDef(
            name=f"core.{_name}",
            summary=("log(softmax(x))" if _log else "exp(x) / sum(exp(x))")
            + " along `axis`, computed stably "
            "(the maximum is subtracted first).",
            operands=_X,
            attrs=(Attr("axis", "int", -1),),
            infer=_infer_softmax,
            reference=_ref_softmax(_log),
            smt=encoding("core_smt", _name),
            interval=ranges.iv_fixed(-ranges.INF if _log else 0.0, 0.0 if _log else 1.0),
            cost=ranges.cost_reduce(3),
            verifies="x is a float tensor of rank >= 1 and axis is in range.",
            example=f"%p = core.{_name} %s {{axis = -1}} : (tensor<?b x 9 x ?q x ?k x f32>) "
            "-> tensor<?b x 9 x ?q x ?k x f32>",
        )
    )
