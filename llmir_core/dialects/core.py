"""The `core` dialect, part 1: elementwise math, cast, matmul, constants, weights, reshape.

Shape-manipulation, indexing and reduction ops live in `core_shape.py` and `core_reduce.py`.
Elementwise ops broadcast like numpy; operands must share one dtype (insert `core.cast`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from llmir_core.ir.dims import DYN, Dim, SymDim, dim_div_exact, eval_dim
from llmir_core.ir.types import DType, TensorType, Type, numpy_dtype

from . import ranges
from .opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError, encoding
from .registry import register, register_dialect
from .shapes import broadcast_shapes, dims_of, float_tensor, like, prod_dims, same_dtype, tensor_arg

register_dialect("core", "tensor math, shapes, indexing, reductions, constants and weights")

_X = (Operand("x"),)
_AB = (Operand("a"), Operand("b"))


def _np(dt: Any) -> Any:
    return numpy_dtype(dt)


# -- elementwise unary ---------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    f = np.frompyfunc(math.erf, 1, 1)
    return np.asarray(f(x.astype(np.float64))).astype(np.float64).astype(x.dtype)


def _in_f64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Compute in float64, round once to the operand's dtype (the reference's precision rule)."""

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(x.astype(np.float64))).astype(x.dtype)

    return run


def _gelu(approximate: str) -> Callable[[np.ndarray], np.ndarray]:
    def exact(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))

    def tanh(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    return _in_f64(exact if approximate == "none" else tanh)


# name: (summary, reference, interval rule)
_UNARY_FLOAT: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray], ranges.IntervalRule]] = {
    "exp": ("e to the power x", np.exp, ranges.iv_exp),
    "log": ("natural logarithm", np.log, ranges.iv_monotone_positive(math.log, log=True)),
    "sqrt": ("square root", np.sqrt, ranges.iv_monotone_positive(math.sqrt)),
    "rsqrt": (
        "1 / sqrt(x)",
        lambda x: 1.0 / np.sqrt(x),
        ranges.iv_monotone_positive(lambda x: 1 / math.sqrt(x)),
    ),
    "tanh": ("hyperbolic tangent", np.tanh, ranges.iv_fixed(-1.0, 1.0)),
    "erf": ("the Gauss error function", _erf, ranges.iv_fixed(-1.0, 1.0)),
    "sigmoid": ("1 / (1 + exp(-x))", lambda x: 1.0 / (1.0 + np.exp(-x)), ranges.iv_fixed(0.0, 1.0)),
    "silu": (
        "x * sigmoid(x) (also called swish)",
        lambda x: x / (1.0 + np.exp(-x)),
        ranges.iv_silu,
    ),
    "sin": ("sine", np.sin, ranges.iv_fixed(-1.0, 1.0)),
    "cos": ("cosine", np.cos, ranges.iv_fixed(-1.0, 1.0)),
    "reciprocal": ("1 / x", lambda x: 1.0 / x, ranges.iv_monotone_positive(lambda x: 1 / x)),
    "floor": ("round toward minus infinity", np.floor, ranges.iv_floor),
    "ceil": ("round toward plus infinity", np.ceil, ranges.iv_ceil),
    "round": ("round half to even", np.round, ranges.iv_round),
}
_UNARY_ANY: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray], ranges.IntervalRule]] = {
    "neg": ("-x", np.negative, ranges.iv_neg),
    "abs": ("|x|", np.abs, ranges.iv_abs),
    "relu": ("max(x, 0)", lambda x: np.maximum(x, np.zeros((), x.dtype)), ranges.iv_relu),
    "sign": ("-1, 0 or 1 by the sign of x", np.sign, ranges.iv_fixed(-1.0, 1.0)),
}


def _infer_unary_float(ctx: InferCtx) -> list[Type]:
    return [float_tensor(ctx, 0, "x")]


def _infer_unary_any(ctx: InferCtx) -> list[Type]:
    t = tensor_arg(ctx, 0, "x")
    if t.dtype == DType.bool or not isinstance(t.dtype, DType):
        raise OpVerifyError(f"x must be numeric, got {t.dtype}")
    return [t]


for _name, (_doc, _fn, _iv) in _UNARY_FLOAT.items():
    register(
        OpDef(
            name=f"core.{_name}",
            summary=f"Elementwise {_doc}.",
            operands=_X,
            attrs=(),
            infer=_infer_unary_float,
            reference=(lambda f: lambda a, at: _in_f64(f)(a[0]))(_fn),
            smt=encoding("core_smt", _name),
            interval=_iv,
            verifies="x is a float tensor; the result has x's type.",
            traits=frozenset({"elementwise"}),
            example=f"%y = core.{_name} %x : (tensor<2x3xf32>) -> tensor<2x3xf32>",
        )
    )
for _name, (_doc, _fn, _iv) in _UNARY_ANY.items():
    register(
        OpDef(
            name=f"core.{_name}",
            summary=f"Elementwise {_doc}.",
            operands=_X,
            attrs=(),
            infer=_infer_unary_any,
            reference=(lambda f: lambda a, at: f(a[0]))(_fn),
            smt=encoding("core_smt", _name),
            interval=_iv,
            verifies="x is a numeric tensor; the result has x's type.",
            traits=frozenset({"elementwise"}),
            example=f"%y = core.{_name} %x : (tensor<?x4xf32>) -> tensor<?x4xf32>",
        )
    )

register(
    OpDef(
        name="core.gelu",
        summary="Elementwise GELU: exact (erf) or the tanh approximation.",
        operands=_X,
        attrs=(Attr("approximate", "str", "none", choices=("none", "tanh")),),
        infer=_infer_unary_float,
        reference=lambda a, at: _gelu(at["approximate"])(a[0]),
        smt=encoding("core_smt", "gelu"),
        interval=ranges.iv_silu,
        verifies="x is a float tensor and approximate is none or tanh.",
        traits=frozenset({"elementwise"}),
        example='%y = core.gelu %x {approximate = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>',
    )
)

register(
    OpDef(
        name="core.not",
        summary="Elementwise logical not.",
        operands=_X,
        attrs=(),
        infer=lambda ctx: [_bool_tensor(ctx, 0)],
        reference=lambda a, at: np.logical_not(a[0]),
        smt=encoding("core_smt", "not"),
        verifies="x is a bool tensor.",
        traits=frozenset({"elementwise"}),
        example="%y = core.not %x : (tensor<3xbool>) -> tensor<3xbool>",
    )
)


def _bool_tensor(ctx: InferCtx, i: int) -> TensorType:
    t = tensor_arg(ctx, i)
    if t.dtype != DType.bool:
        raise OpVerifyError(f"operand #{i} must be bool, got {t.dtype}")
    return t


# -- elementwise binary --------------------------------------------------------------------


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        with np.errstate(all="ignore"):
            q = np.floor_divide(a, b)
            fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
            return (q + fix).astype(a.dtype)
    with np.errstate(all="ignore"):
        return np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if a.dtype.kind == "f":
            return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
        return np.power(a, b)


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.fmod(a, b) if a.dtype.kind == "f" else np.remainder(a, b)


# name: (summary, reference, commutative, interval rule)
_BINARY: dict[
    str,
    tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray], bool, ranges.IntervalRule | None],
] = {
    "add": ("a + b", np.add, True, ranges.iv_add),
    "sub": ("a - b", np.subtract, False, ranges.iv_sub),
    "mul": ("a * b", np.multiply, True, ranges.iv_mul),
    "div": ("a / b (integers truncate toward zero)", _int_div, False, ranges.iv_div),
    "pow": ("a to the power b", _pow, False, ranges.iv_pow),
    "max": ("the larger of a and b (NaN propagates)", np.maximum, True, ranges.iv_max),
    "min": ("the smaller of a and b (NaN propagates)", np.minimum, True, ranges.iv_min),
    "mod": ("remainder: sign of b for integers, fmod (sign of a) for floats", _mod, False, None),
}


def _infer_binary(ctx: InferCtx) -> list[Type]:
    a, b = tensor_arg(ctx, 0, "a"), tensor_arg(ctx, 1, "b")
    dt = same_dtype(ctx)
    if dt == DType.bool:
        raise OpVerifyError("arithmetic on bool tensors; use core.and/core.or")
    return (
        [like(a, broadcast_shapes(a.shape, b.shape))]
        if a.rank >= b.rank
        else [like(b, broadcast_shapes(a.shape, b.shape))]
    )


def _same_dtype_binop(
    f: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> Callable[..., np.ndarray]:
    def run(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        a, b = args
        with np.errstate(all="ignore"):
            return np.asarray(f(a, b)).astype(a.dtype, copy=False)

    return run


for _name, (_doc, _bfn, _comm, _iv2) in _BINARY.items():
    register(
        OpDef(
            name=f"core.{_name}",
            summary=f"Elementwise {_doc}, with numpy broadcasting.",
            operands=_AB,
            attrs=(),
            infer=_infer_binary,
            reference=_same_dtype_binop(_bfn),
            smt=encoding("core_smt", _name),
            interval=_iv2,
            verifies="a and b have the same numeric dtype and broadcastable shapes.",
            traits=frozenset({"elementwise", "broadcast"} | ({"commutative"} if _comm else set())),
            example=f"%c = core.{_name} %a, %b : (tensor<?batch x 4 x f32>, tensor<4xf32>) -> tensor<?batch x 4 x f32>",
        )
    )

_COMPARE: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "equal": ("a == b", np.equal),
    "not_equal": ("a != b", np.not_equal),
    "less": ("a < b", np.less),
    "less_equal": ("a <= b", np.less_equal),
    "greater": ("a > b", np.greater),
    "greater_equal": ("a >= b", np.greater_equal),
}


def _infer_compare(ctx: InferCtx) -> list[Type]:
    a, b = tensor_arg(ctx, 0, "a"), tensor_arg(ctx, 1, "b")
    same_dtype(ctx)
    return [TensorType(broadcast_shapes(a.shape, b.shape), DType.bool)]


for _name, (_doc, _cfn) in _COMPARE.items():
    register(
        OpDef(
            name=f"core.{_name}",
            summary=f"Elementwise comparison {_doc}, giving bool.",
            operands=_AB,
            attrs=(),
            infer=_infer_compare,
            reference=(lambda f: lambda a, at: f(a[0], a[1]))(_cfn),
            smt=encoding("core_smt", _name),
            verifies="a and b have the same dtype and broadcastable shapes; the result is bool.",
            traits=frozenset({"elementwise", "broadcast"}),
            example=f"%m = core.{_name} %a, %b : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xbool>",
        )
    )

_LOGICAL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _infer_logical(ctx: InferCtx) -> list[Type]:
    a, b = _bool_tensor(ctx, 0), _bool_tensor(ctx, 1)
    return [TensorType(broadcast_shapes(a.shape, b.shape), DType.bool)]


for _name, _lfn in _LOGICAL.items():
    register(
        OpDef(
            name=f"core.{_name}",
            summary=f"Elementwise logical {_name} of bool tensors.",
            operands=_AB,
            attrs=(),
            infer=_infer_logical,
            reference=(lambda f: lambda a, at: f(a[0], a[1]))(_lfn),
            smt=encoding("core_smt", _name),
            verifies="a and b are bool tensors with broadcastable shapes.",
            traits=frozenset({"elementwise", "broadcast", "commutative"}),
            example=f"%m = core.{_name} %a, %b : (tensor<4xbool>, tensor<4xbool>) -> tensor<4xbool>",
        )
    )


def _infer_where(ctx: InferCtx) -> list[Type]:
    c = _bool_tensor(ctx, 0)
    a, b = tensor_arg(ctx, 1, "a"), tensor_arg(ctx, 2, "b")
    same_dtype(ctx, [1, 2])
    return [like(a, broadcast_shapes(c.shape, a.shape, b.shape))]


register(
    OpDef(
        name="core.where",
        summary="Elementwise select: a where cond is true, else b.",
        operands=(Operand("cond"), Operand("a"), Operand("b")),
        attrs=(),
        infer=_infer_where,
        reference=lambda a, at: np.where(a[0], a[1], a[2]).astype(a[1].dtype),
        smt=encoding("core_smt", "where"),
        interval=ranges.iv_where,
        verifies="cond is bool, a and b share a dtype, and all three shapes broadcast.",
        traits=frozenset({"elementwise", "broadcast"}),
        example="%y = core.where %c, %a, %b : (tensor<4xbool>, tensor<4xf32>, tensor<f32>) -> tensor<4xf32>",
    )
)


def _cast(x: np.ndarray, to: DType) -> np.ndarray:
    target = numpy_dtype(to)
    with np.errstate(all="ignore"):
        if x.dtype.kind == "f" and target.kind in "iu":
            return np.trunc(x).astype(target)
        if to == DType.bool:
            return x != 0
        return x.astype(target)


register(
    OpDef(
        name="core.cast",
        summary="Convert each element to dtype `to` (floats to ints truncate).",
        operands=_X,
        attrs=(Attr("to", "dtype", doc="target dtype"),),
        infer=lambda ctx: [like(tensor_arg(ctx, 0), dtype=ctx["to"])],
        reference=lambda a, at: _cast(a[0], at["to"]),
        smt=encoding("core_smt", "cast"),
        interval=ranges.iv_first,
        verifies="x is a tensor and `to` is a dtype.",
        traits=frozenset({"elementwise"}),
        example="%y = core.cast %x {to = f16} : (tensor<2x2xf32>) -> tensor<2x2xf16>",
    )
)


# -- matmul ---------------------------------------------------------------------------------


def _infer_matmul(ctx: InferCtx) -> list[Type]:
    a, b = tensor_arg(ctx, 0, "a"), tensor_arg(ctx, 1, "b")
    same_dtype(ctx)
    ta, tb = ctx["transpose_a"], ctx["transpose_b"]
    if a.rank == 0 or b.rank == 0:
        raise OpVerifyError("matmul operands must have rank >= 1")
    if (ta and a.rank < 2) or (tb and b.rank < 2):
        raise OpVerifyError("transpose_a/transpose_b need rank >= 2")
    ash, bsh = list(a.shape), list(b.shape)
    if ta:
        ash[-1], ash[-2] = ash[-2], ash[-1]
    if tb:
        bsh[-1], bsh[-2] = bsh[-2], bsh[-1]
    a1, b1 = len(ash) == 1, len(bsh) == 1
    if a1:
        ash = [1] + ash
    if b1:
        bsh = bsh + [1]
    k1, k2 = ash[-1], bsh[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        raise OpVerifyError(f"contraction dims differ: a has {k1}, b has {k2}")
    if isinstance(k1, SymDim) and isinstance(k2, SymDim) and k1 != k2:
        raise OpVerifyError("contraction dims differ symbolically")
    batch = broadcast_shapes(ash[:-2], bsh[:-2])
    out = list(batch) + ([] if a1 else [ash[-2]]) + ([] if b1 else [bsh[-1]])
    return [like(a if a.rank >= b.rank else b, out)]


def _ref_matmul(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    a, b = args
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    if a.dtype.kind == "f" and a.dtype.itemsize < 4 or a.dtype.kind not in "fiub":
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return np.matmul(a, b)


register(
    OpDef(
        name="core.matmul",
        summary="Batched matrix product with numpy broadcasting over batch dims; transpose_a/b swap the last two dims.",
        operands=_AB,
        attrs=(Attr("transpose_a", "bool", False), Attr("transpose_b", "bool", False)),
        infer=_infer_matmul,
        reference=_ref_matmul,
        smt=encoding("core_smt", "matmul"),
        interval=ranges.iv_matmul,
        cost=ranges.cost_matmul,
        verifies="a and b share a dtype, their contraction dims agree and their batch dims broadcast.",
        example="%y = core.matmul %x, %w {transpose_b = true} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<128x64xf32>) -> tensor<?batch x ?seq x 128 x f32>",
    )
)


# -- constants and weights ------------------------------------------------------------------


def _infer_constant(ctx: InferCtx) -> list[Type]:
    return [ctx["value"].type]


register(
    OpDef(
        name="core.constant",
        summary="A small constant written inline as a dense literal.",
        operands=(),
        attrs=(Attr("value", "dense", doc="the value, with its type"),),
        infer=_infer_constant,
        reference=lambda a, at: np.array(at["value"].array),
        smt=encoding("core_smt", "constant"),
        interval=ranges.iv_constant,
        cost=ranges.cost_free,
        verifies="value is a dense literal whose type is the result type.",
        example="%c = core.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>",
    )
)


def _infer_weight(ctx: InferCtx) -> list[Type]:
    if not ctx.declared or len(ctx.declared) != 1:
        raise OpVerifyError("core.weight needs its result type written out")
    t = ctx.declared[0]
    if not isinstance(t, TensorType) or t.static_shape() is None:
        raise OpVerifyError(f"a weight needs a static tensor type, got {t}")
    return [t]


register(
    OpDef(
        name="core.weight",
        summary="A tensor stored outside the text: bytes at `offset` in `file`, mapped on use, never copied.",
        operands=(),
        attrs=(
            Attr("file", "str", doc="path relative to the .llmir file's folder, or absolute"),
            Attr("name", "str", "", doc="the tensor's name in its source file"),
            Attr("offset", "int", 0, doc="byte offset of the data in the file"),
            Attr("nbytes", "int", doc="number of bytes"),
            Attr("sha256", "str", None, doc="sha256 of those bytes, when pinned"),
        ),
        infer=_infer_weight,
        reference=None,
        no_smt="its values are a weight file's bytes: a leaf (translation validation keys it by "
        "file, name and offset)",
        cost=ranges.cost_free,
        verifies="the result type is static, nbytes matches it and the bytes lie inside the file.",
        example='%w = core.weight {file = "w.bin", name = "lm_head.weight", nbytes = 0, offset = 0} '
        ": () -> tensor<0x4xf32>",
    )
)


# -- reshape ----------------------------------------------------------------------------------


def _infer_reshape(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0)
    target = list(dims_of(ctx["shape"]))
    out: list[Dim] = []
    infer_at = None
    for i, d in enumerate(target):
        if d == -1:
            if infer_at is not None:
                raise OpVerifyError("shape has more than one -1")
            infer_at = i
            out.append(DYN)
        elif d == 0 and not ctx["allowzero"]:
            if i >= x.rank:
                raise OpVerifyError(f"shape[{i}] = 0 copies a dim x does not have")
            out.append(x.shape[i])
        elif isinstance(d, int) and d < -1:
            raise OpVerifyError(f"shape[{i}] = {d} is not a valid size")
        else:
            out.append(d)
    total = prod_dims(x.shape)
    if infer_at is not None:
        known = prod_dims([d for j, d in enumerate(out) if j != infer_at])
        out[infer_at] = dim_div_exact(total, known) if known != 0 else DYN
    else:
        new_total = prod_dims(out)
        if isinstance(total, int) and isinstance(new_total, int) and total != new_total:
            raise OpVerifyError(f"cannot reshape {total} elements into {new_total}")
        if (
            isinstance(total, SymDim)
            and isinstance(new_total, (int, SymDim))
            and DYN not in out
            and total != new_total
        ):
            raise OpVerifyError("element counts differ symbolically")
    return [like(x, out)]


def _ref_reshape(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    env = attrs.get("__env__", {})
    shape: list[int] = []
    for i, d in enumerate(attrs["shape"]):
        if isinstance(d, int):
            shape.append(x.shape[i] if d == 0 and not attrs["allowzero"] else d)
        else:
            v = eval_dim(d, env)
            shape.append(-1 if v is None else v)
    return np.reshape(x, shape)


register(
    OpDef(
        name="core.reshape",
        summary="View x with a new shape of the same element count (0 copies a dim unless allowzero, -1 is inferred).",
        operands=_X,
        attrs=(
            Attr("shape", "dims", doc="target dims: ints, -1, 0, or symbolic dims"),
            Attr("allowzero", "bool", False, doc="treat 0 as a size, not as 'copy'"),
        ),
        infer=_infer_reshape,
        reference=_ref_reshape,
        smt=encoding("core_smt", "reshape"),
        interval=ranges.iv_first,
        cost=ranges.cost_view,
        traits=frozenset({"view"}),
        verifies="at most one -1, and the element counts agree where they are known.",
        example="%y = core.reshape %x {shape = [?batch, ?seq, 9, 64]} : (tensor<?batch x ?seq x 576 x f32>) "
        "-> tensor<?batch x ?seq x 9 x 64 x f32>",
    )
)

__all__ = ["_np"]
