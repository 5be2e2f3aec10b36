"""How each ONNX op becomes llmir ops: one handler per (domain, op_type), as a table.

A handler receives a `Node` (inputs as llmir Values, attributes as plain Python values, the
node's opset, and what is known of constant and shape-valued inputs) and returns one llmir Value
per ONNX output (None for an unused optional output). It raises `NotMapped` with a reason when an
attribute combination has no llmir equivalent; `NeedsConstant` when an input that llmir takes as
an attribute (axes, pads, repeats, k, ...) is not constant. This module imports neither onnx nor
onnx_ir: `onnx.py` builds the `Node`s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Value
from llmir_core.ir.dims import DYN, Dim, SymDim, dim_div_exact, dim_mul
from llmir_core.ir.types import DType, QuantType, TensorType, numpy_dtype

if TYPE_CHECKING:
    from .onnx import _Importer


class NotMapped(Exception):
    """The node has no llmir equivalent (the message says why)."""


class NeedsConstant(NotMapped):
    """An input llmir takes as an attribute is computed at run time."""

    def __init__(self, input_name: str, what: str) -> None:
        super().__init__(
            f"input '{input_name}' ({what}) must be a constant: an initializer or a Constant node"
        )
        self.input_name = input_name


class Node:
    """One ONNX node as a handler sees it."""

    def __init__(
        self,
        imp: _Importer,
        op_type: str,
        domain: str,
        opset: int,
        name: str,
        inputs: list[Value | None],
        input_names: list[str],
        attrs: dict[str, Any],
        num_outputs: int,
        outputs_used: list[bool],
        out_hints: list[TensorType | None],
    ) -> None:
        self.imp = imp
        self.op_type = op_type
        self.domain = domain
        self.opset = opset
        self.name = name
        self.inputs = inputs
        self.input_names = input_names
        self.attrs = attrs
        self.num_outputs = num_outputs
        self.outputs_used = outputs_used
        self.out_hints = out_hints

    # -- inputs and attributes ------------------------------------------------------------
    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def inp(self, i: int) -> Value:
        if not self.has(i):
            raise NotMapped(f"input #{i} is required")
        v = self.inputs[i]
        assert v is not None
        return v

    def t(self, i: int) -> TensorType:
        ty = self.inp(i).type
        if not isinstance(ty, TensorType):
            raise NotMapped(f"input #{i} is not a tensor")
        return ty

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def known(self, i: int) -> np.ndarray | None:
        """The contents of input i when known at import time (numeric, or object array of dims)."""
        if not self.has(i):
            return None
        return self.imp.known.get(id(self.inputs[i]))

    def const(self, i: int, what: str) -> np.ndarray:
        """Input i's numeric value, which must be known at import time."""
        k = self.known(i)
        if k is None or k.dtype == object:
            raise NeedsConstant(self.input_names[i], what)
        return k

    def ints(self, i: int, what: str) -> list[int]:
        return [int(v) for v in self.const(i, what).reshape(-1)]

    def dims(self, i: int) -> list[Dim] | None:
        """Input i's contents as dims (ints or symbolic), or None when not fully known."""
        k = self.known(i)
        if k is None or k.ndim > 1:
            return None
        out: list[Dim] = []
        for v in k.reshape(-1):
            if isinstance(v, SymDim):
                out.append(v)
            elif isinstance(v, (int, np.integer)):
                out.append(int(v))
            else:
                return None
        return out

    # -- building -------------------------------------------------------------------------
    def emit(
        self, name: str, *operands: Value, hint: TensorType | None = None, **attrs: Any
    ) -> Value:
        return self.imp.emit(name, list(operands), attrs, [hint] if hint else None)[0]

    def emit_n(
        self,
        name: str,
        operands: Sequence[Value],
        attrs: dict[str, Any],
        n: int | None = None,
        hints: list[TensorType | None] | None = None,
    ) -> list[Value]:
        return self.imp.emit(name, list(operands), attrs, hints, n)

    def scalar(self, value: float | int | bool, like: Value | DType) -> Value:
        dt = like if isinstance(like, DType) else _dtype(like)
        return self.imp.constant(np.array(value, dtype=numpy_dtype(dt)))

    def array(self, value: Any, dtype: DType) -> Value:
        return self.imp.constant(np.array(value, dtype=numpy_dtype(dtype)))

    def cast(self, v: Value, to: DType) -> Value:
        return v if _dtype(v) == to else self.emit("core.cast", v, to=to)


def _dtype(v: Value) -> DType:
    t = v.type
    if not isinstance(t, TensorType) or not isinstance(t.dtype, DType):
        raise NotMapped(f"%{v.name} is not a plain tensor")
    return t.dtype


def _rank(v: Value) -> int:
    t = v.type
    assert isinstance(t, TensorType)
    return t.rank


Handler = Callable[[Node], "list[Value | None]"]
HANDLERS: dict[tuple[str, str], Handler] = {}
MS = "com.microsoft"


def handles(*op_types: str, domain: str = "") -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for o in op_types:
            HANDLERS[(domain, o)] = fn
        return fn

    return deco


# -- elementwise ------------------------------------------------------------------------------

_UNARY = {
    "Abs": "abs",
    "Neg": "neg",
    "Relu": "relu",
    "Sign": "sign",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Tanh": "tanh",
    "Erf": "erf",
    "Sigmoid": "sigmoid",
    "Sin": "sin",
    "Cos": "cos",
    "Reciprocal": "reciprocal",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Not": "not",
}


@handles(*_UNARY)
def _unary(n: Node) -> list[Value | None]:
    return [n.emit(f"core.{_UNARY[n.op_type]}", n.inp(0))]


_BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "Equal": "equal",
    "Less": "less",
    "LessOrEqual": "less_equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_equal",
    "And": "and",
    "Or": "or",
    "Xor": "xor",
}


@handles(*_BINARY)
def _binary(n: Node) -> list[Value | None]:
    return [n.emit(f"core.{_BINARY[n.op_type]}", n.inp(0), n.inp(1))]


@handles("Pow")
def _pow(n: Node) -> list[Value | None]:
    x = n.inp(0)
    return [n.emit("core.pow", x, n.cast(n.inp(1), _dtype(x)))]


@handles("Mod")
def _mod(n: Node) -> list[Value | None]:
    a, b = n.inp(0), n.inp(1)
    fmod = bool(n.attr("fmod", 0))
    if _dtype(a).is_float:
        r = n.emit("core.mod", a, b)  # fmod: the sign of the dividend
        if fmod:
            return [r]
        # fmod=0 on floats (as the ONNX reference computes it): the sign of the divisor
        zero = n.scalar(0, a)
        fix = n.emit(
            "core.and",
            n.emit("core.not_equal", r, zero),
            n.emit("core.not_equal", n.emit("core.less", r, zero), n.emit("core.less", b, zero)),
        )
        return [n.emit("core.where", fix, n.emit("core.add", r, b), r)]
    if not fmod:
        return [n.emit("core.mod", a, b)]
    # integer fmod: the remainder takes the sign of the dividend (a - trunc(a / b) * b)
    q = n.emit("core.div", a, b)
    return [n.emit("core.sub", a, n.emit("core.mul", q, b))]


_VARIADIC = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}


@handles(*_VARIADIC)
def _variadic(n: Node) -> list[Value | None]:
    vals = [n.inp(i) for i in range(len(n.inputs))]
    acc = vals[0]
    for v in vals[1:]:
        acc = n.emit(f"core.{_VARIADIC[n.op_type]}", acc, v)
    if n.op_type == "Mean" and len(vals) > 1:
        acc = n.emit("core.div", acc, n.scalar(len(vals), acc))
    elif len(vals) == 1:
        acc = n.emit("core.identity", acc)
    return [acc]


@handles("Where")
def _where(n: Node) -> list[Value | None]:
    return [n.emit("core.where", n.inp(0), n.inp(1), n.inp(2))]


# largest finite value of each float8 type; ONNX's saturating casts clamp to it
_F8_MAX = {
    DType.f8e4m3: 448.0,
    DType.f8e5m2: 57344.0,
    DType.f8e4m3fnuz: 240.0,
    DType.f8e5m2fnuz: 57344.0,
}


def _cast_to(n: Node, x: Value, to: DType) -> Value:
    """ONNX Cast semantics over llmir's core.cast (which rounds to nearest even and, like numpy's
    ml_dtypes casts, does not saturate): float -> float8 saturates by default (saturate=1: out of
    range and +-inf clamp to the largest finite value); float -> float8e8m0 rounds as
    `round_mode` says."""
    if _dtype(x).is_float and to == DType.f8e8m0:
        return _cast_to_e8m0(n, x)
    if to in _F8_MAX and _dtype(x).is_float and n.attr("saturate", 1):
        m = _F8_MAX[to]
        x = n.emit("core.max", n.emit("core.min", x, n.scalar(m, x)), n.scalar(-m, x))
    return n.emit("core.cast", x, to=to)


def _cast_to_e8m0(n: Node, x: Value) -> Value:
    """float -> float8e8m0 (2**(c - 127) for codes c 0..254, 255 NaN) as ONNX defines it on
    x's float32 bits: c is the exponent field (the sign is dropped; subnormals and zero have 0),
    incremented when round_mode is 'up' and the fraction is not zero, or when it is 'nearest'
    and the fraction is at least half (a subnormal: more than half); NaN and inf give NaN; the
    increment past 254 is NaN unless saturate. Computed exactly in float64."""
    mode = n.attr("round_mode", "up")
    if mode not in ("up", "down", "nearest"):
        raise NotMapped(f"Cast round_mode '{mode}'")
    w = n.emit("core.abs", n.cast(n.cast(x, DType.f32), DType.f64))
    two = n.scalar(2.0, w)

    def f64(b: Value) -> Value:
        return n.cast(b, DType.f64)

    special = n.emit("core.not", n.emit("core.less_equal", w, n.scalar(3.4028234663852886e38, w)))
    normal = n.emit("core.greater_equal", w, n.scalar(2.0**-126, w))
    safe = n.emit("core.where", normal, w, n.scalar(1.0, w))
    e = n.emit("core.floor", n.emit("core.div", n.emit("core.log", safe), n.scalar(math.log(2), w)))
    # correct the floating log2 so that 2**e <= w < 2**(e+1) exactly
    e = n.emit("core.sub", e, f64(n.emit("core.greater", n.emit("core.pow", two, e), safe)))
    e1 = n.emit("core.add", e, n.scalar(1.0, w))
    e = n.emit("core.add", e, f64(n.emit("core.less_equal", n.emit("core.pow", two, e1), safe)))
    code = n.emit("core.where", normal, n.emit("core.add", e, n.scalar(127.0, w)), n.scalar(0.0, w))
    base = n.emit("core.pow", two, e)
    if mode == "up":
        frac = n.emit("core.not_equal", w, n.emit("core.where", normal, base, n.scalar(0.0, w)))
        inc = f64(frac)
    elif mode == "nearest":
        half = n.emit("core.greater_equal", w, n.emit("core.mul", base, n.scalar(1.5, w)))
        sub = n.emit("core.greater", w, n.scalar(2.0**-127, w))
        pick = n.emit("core.and", normal, half)  # core.or/and: onnxruntime has no bool Where
        inc = f64(n.emit("core.or", pick, n.emit("core.and", n.emit("core.not", normal), sub)))
    else:
        inc = n.scalar(0.0, w)
    if n.attr("saturate", 1):
        inc = n.emit("core.mul", inc, f64(n.emit("core.not_equal", code, n.scalar(254.0, w))))
    code = n.emit("core.add", code, inc)
    bad = n.emit("core.or", special, n.emit("core.equal", code, n.scalar(255.0, w)))
    value = n.emit("core.pow", two, n.emit("core.sub", code, n.scalar(127.0, w)))
    y = n.emit("core.where", bad, n.scalar(math.nan, w), value)
    return n.emit("core.cast", n.cast(y, DType.f32), to=DType.f8e8m0)  # exact: powers of two


@handles("Cast")
def _cast_op(n: Node) -> list[Value | None]:
    return [_cast_to(n, n.inp(0), n.imp.dtype_of_onnx(n.attr("to")))]


@handles("CastLike")
def _castlike(n: Node) -> list[Value | None]:
    return [_cast_to(n, n.inp(0), _dtype(n.inp(1)))]


@handles("Gelu")
def _gelu(n: Node) -> list[Value | None]:
    return [n.emit("core.gelu", n.inp(0), approximate=n.attr("approximate", "none"))]


@handles("Identity")
def _identity(n: Node) -> list[Value | None]:
    return [n.emit("core.identity", n.inp(0))]


@handles("Dropout")
def _dropout(n: Node) -> list[Value | None]:
    x = n.inp(0)
    if n.has(2) and bool(n.const(2, "training_mode").reshape(-1)[0]):
        ratio = float(n.const(1, "ratio").reshape(-1)[0]) if n.has(1) else 0.5
        if ratio != 0.0:
            raise NotMapped("Dropout in training mode is random")
    mask: Value | None = None
    if len(n.outputs_used) > 1 and n.outputs_used[1]:
        t = n.t(0)
        mask = n.emit(
            "core.constant_of_shape",
            n.emit("core.shape", x),
            value=DenseAttr(np.array(True)),
            hint=TensorType(t.shape, DType.bool),
        )
    return [n.emit("core.identity", x), mask]


@handles("Clip")
def _clip(n: Node) -> list[Value | None]:
    y = n.inp(0)
    if n.has(1):
        y = n.emit("core.max", y, n.inp(1))
    if n.has(2):
        y = n.emit("core.min", y, n.inp(2))
    if y is n.inp(0):
        y = n.emit("core.identity", y)
    return [y]


@handles("IsNaN")
def _isnan(n: Node) -> list[Value | None]:
    x = n.inp(0)
    return [n.emit("core.not_equal", x, x)]


@handles("IsInf")
def _isinf(n: Node) -> list[Value | None]:
    x = n.inp(0)
    pos, neg = n.attr("detect_positive", 1), n.attr("detect_negative", 1)
    parts = []
    if pos:
        parts.append(n.emit("core.equal", x, n.scalar(math.inf, x)))
    if neg:
        parts.append(n.emit("core.equal", x, n.scalar(-math.inf, x)))
    if not parts:  # detects nothing: all false
        return [n.emit("core.and", n.emit("core.equal", x, x), n.emit("core.not_equal", x, x))]
    return [parts[0] if len(parts) == 1 else n.emit("core.or", parts[0], parts[1])]


# -- activations that decompose into core ops ---------------------------------------------------


def _where_neg(n: Node, x: Value, neg: Value, pos: Value, inclusive: bool = False) -> Value:
    cond = n.emit("core.less_equal" if inclusive else "core.less", x, n.scalar(0, x))
    return n.emit("core.where", cond, neg, pos)


@handles("LeakyRelu")
def _leaky(n: Node) -> list[Value | None]:
    x = n.inp(0)
    return [_where_neg(n, x, n.emit("core.mul", x, n.scalar(n.attr("alpha", 0.01), x)), x)]


@handles("PRelu")
def _prelu(n: Node) -> list[Value | None]:
    x = n.inp(0)
    return [_where_neg(n, x, n.emit("core.mul", x, n.inp(1)), x)]


@handles("Elu")
def _elu(n: Node) -> list[Value | None]:
    x = n.inp(0)
    em1 = n.emit("core.sub", n.emit("core.exp", x), n.scalar(1, x))
    return [_where_neg(n, x, n.emit("core.mul", em1, n.scalar(n.attr("alpha", 1.0), x)), x)]


@handles("Selu")
def _selu(n: Node) -> list[Value | None]:
    x = n.inp(0)
    alpha, gamma = (
        n.attr("alpha", 1.67326319217681884765625),
        n.attr("gamma", 1.05070102214813232421875),
    )
    em1 = n.emit("core.sub", n.emit("core.exp", x), n.scalar(1, x))
    y = _where_neg(n, x, n.emit("core.mul", em1, n.scalar(alpha, x)), x, inclusive=True)
    return [n.emit("core.mul", y, n.scalar(gamma, x))]


@handles("Celu")
def _celu(n: Node) -> list[Value | None]:
    x = n.inp(0)
    a = n.scalar(n.attr("alpha", 1.0), x)
    em1 = n.emit("core.sub", n.emit("core.exp", n.emit("core.div", x, a)), n.scalar(1, x))
    neg = n.emit("core.min", n.scalar(0, x), n.emit("core.mul", a, em1))
    return [n.emit("core.add", n.emit("core.relu", x), neg)]


@handles("ThresholdedRelu")
def _trelu(n: Node) -> list[Value | None]:
    x = n.inp(0)
    cond = n.emit("core.greater", x, n.scalar(n.attr("alpha", 1.0), x))
    return [n.emit("core.where", cond, x, n.scalar(0, x))]


@handles("HardSigmoid")
def _hsig(n: Node) -> list[Value | None]:
    x = n.inp(0)
    y = n.emit(
        "core.add",
        n.emit("core.mul", x, n.scalar(n.attr("alpha", 0.2), x)),
        n.scalar(n.attr("beta", 0.5), x),
    )
    return [n.emit("core.max", n.emit("core.min", y, n.scalar(1, x)), n.scalar(0, x))]


@handles("HardSwish")
def _hswish(n: Node) -> list[Value | None]:
    x = n.inp(0)
    y = n.emit("core.add", n.emit("core.mul", x, n.scalar(1.0 / 6.0, x)), n.scalar(0.5, x))
    y = n.emit("core.max", n.emit("core.min", y, n.scalar(1, x)), n.scalar(0, x))
    return [n.emit("core.mul", x, y)]


def _softplus_v(n: Node, x: Value) -> Value:
    return n.emit("core.log", n.emit("core.add", n.emit("core.exp", x), n.scalar(1, x)))


@handles("Softplus")
def _softplus(n: Node) -> list[Value | None]:
    return [_softplus_v(n, n.inp(0))]


@handles("Softsign")
def _softsign(n: Node) -> list[Value | None]:
    x = n.inp(0)
    return [n.emit("core.div", x, n.emit("core.add", n.emit("core.abs", x), n.scalar(1, x)))]


@handles("Mish")
def _mish(n: Node) -> list[Value | None]:
    x = n.inp(0)
    return [n.emit("core.mul", x, n.emit("core.tanh", _softplus_v(n, x)))]


def _swish_of(n: Node, x: Value, alpha: float) -> Value:
    if alpha == 1.0:
        return n.emit("core.silu", x)
    return n.emit("core.mul", x, n.emit("core.sigmoid", n.emit("core.mul", x, n.scalar(alpha, x))))


@handles("Swish")
def _swish(n: Node) -> list[Value | None]:
    return [_swish_of(n, n.inp(0), float(n.attr("alpha", 1.0)))]


@handles("SwiGLU")
def _swiglu(n: Node) -> list[Value | None]:
    """Y = Swish_alpha(A) * B (A and B of one shape)."""
    return [n.emit("core.mul", _swish_of(n, n.inp(0), float(n.attr("alpha", 1.0))), n.inp(1))]


@handles("QuickGelu", domain=MS)
def _quick_gelu(n: Node) -> list[Value | None]:
    x = n.inp(0)
    return [
        n.emit(
            "core.mul",
            x,
            n.emit("core.sigmoid", n.emit("core.mul", x, n.scalar(n.attr("alpha", 1.702), x))),
        )
    ]


@handles("Gelu", domain=MS)
def _ms_gelu(n: Node) -> list[Value | None]:
    return [n.emit("core.gelu", n.inp(0))]


@handles("FastGelu", domain=MS)
def _ms_fast_gelu(n: Node) -> list[Value | None]:
    x = n.emit("core.add", n.inp(0), n.inp(1)) if n.has(1) else n.inp(0)
    return [n.emit("core.gelu", x, approximate="tanh")]


# -- matmul ------------------------------------------------------------------------------------


@handles("MatMul")
def _matmul(n: Node) -> list[Value | None]:
    return [n.emit("core.matmul", n.inp(0), n.inp(1))]


@handles("Gemm")
def _gemm(n: Node) -> list[Value | None]:
    a, b = n.inp(0), n.inp(1)
    y = n.emit(
        "core.matmul",
        a,
        b,
        transpose_a=bool(n.attr("transA", 0)),
        transpose_b=bool(n.attr("transB", 0)),
    )
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    if alpha != 1.0:
        y = n.emit("core.mul", y, n.scalar(alpha, y))
    if n.has(2) and beta != 0.0:
        c = n.inp(2)
        if beta != 1.0:
            c = n.emit("core.mul", c, n.scalar(beta, c))
        y = n.emit("core.add", y, c)
    return [y]


@handles("FusedMatMul", domain=MS)
def _fused_matmul(n: Node) -> list[Value | None]:
    y = n.emit(
        "core.matmul",
        n.inp(0),
        n.inp(1),
        transpose_a=bool(n.attr("transA", 0)),
        transpose_b=bool(n.attr("transB", 0)),
    )
    alpha = float(n.attr("alpha", 1.0))
    return [y if alpha == 1.0 else n.emit("core.mul", y, n.scalar(alpha, y))]


# -- constants and shapes ------------------------------------------------------------------------


@handles("Constant")
def _constant(n: Node) -> list[Value | None]:
    a = n.attrs
    if "value" in a:
        arr = a["value"]
    elif "value_float" in a:
        arr = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.array(a["value_ints"], np.int64)
    else:
        raise NotMapped("only tensor, float(s) and int(s) constants are supported")
    if not isinstance(arr, np.ndarray):
        raise NotMapped("unsupported constant value")
    return [n.imp.constant(arr, name=n.imp.node_value_name)]


@handles("Reshape")
def _reshape(n: Node) -> list[Value | None]:
    x = n.inp(0)
    extra: dict[str, Any] = {"allowzero": True} if n.attr("allowzero", 0) else {}
    dims = n.dims(1)
    if dims is not None:
        return [n.emit("core.reshape", x, shape=tuple(dims), **extra)]
    return [n.emit("core.reshape_dyn", x, n.inp(1), hint=n.out_hints[0], **extra)]


@handles("Flatten")
def _flatten(n: Node) -> list[Value | None]:
    return [n.emit("core.flatten", n.inp(0), axis=int(n.attr("axis", 1)))]


@handles("Transpose")
def _transpose(n: Node) -> list[Value | None]:
    x = n.inp(0)
    perm = n.attr("perm")
    if perm is None:
        perm = list(range(_rank(x)))[::-1]
    return [n.emit("core.transpose", x, perm=tuple(int(p) for p in perm))]


@handles("Concat")
def _concat(n: Node) -> list[Value | None]:
    vals = [n.inp(i) for i in range(len(n.inputs))]
    return [n.emit("core.concat", *vals, axis=int(n.attr("axis")))]


@handles("Split")
def _split(n: Node) -> list[Value | None]:
    x = n.inp(0)
    t = n.t(0)
    axis = int(n.attr("axis", 0))
    ax = axis + t.rank if axis < 0 else axis
    sizes: Sequence[Dim]
    if n.opset < 13 and n.attr("split") is not None:
        sizes = [int(s) for s in n.attr("split")]
    elif n.has(1):
        sizes = [int(s) for s in n.ints(1, "split sizes")]
    else:
        count = int(n.attr("num_outputs", n.num_outputs))
        d = t.shape[ax]
        if isinstance(d, int):
            chunk = -(-d // count)
            sizes = [chunk] * (count - 1) + [d - chunk * (count - 1)]
            if n.attr("num_outputs") is None and d % count:
                raise NotMapped(f"dim {d} does not split evenly into {count}")
        else:
            part = dim_div_exact(d, count)
            if part is DYN:
                raise NotMapped(f"cannot split dynamic dim {d} into {count} equal parts")
            sizes = [part] * count
    outs = n.emit_n(
        "core.split",
        [x],
        {"axis": axis, "sizes": tuple(sizes)},
        len(sizes),
        hints=n.out_hints[: len(sizes)],
    )
    return list(outs)


@handles("Slice")
def _slice(n: Node) -> list[Value | None]:
    x = n.inp(0)
    k = [n.known(i) if n.has(i) else None for i in range(1, 5)]
    static = (
        all(v is None or v.dtype != object for v in k)
        and k[0] is not None
        and k[1] is not None
        and (not n.has(3) or k[2] is not None)
        and (not n.has(4) or k[3] is not None)
    )
    if static:
        starts, ends = n.ints(1, "starts"), n.ints(2, "ends")
        axes = n.ints(3, "axes") if n.has(3) else list(range(len(starts)))
        steps = n.ints(4, "steps") if n.has(4) else [1] * len(starts)
        return [
            n.emit(
                "core.slice",
                x,
                starts=tuple(starts),
                ends=tuple(ends),
                axes=tuple(axes),
                steps=tuple(steps),
            )
        ]
    ops = [x, n.inp(1), n.inp(2)]
    if n.has(3) or n.has(4):
        dt = _dtype(n.inp(1))
        count = n.cast(n.emit("core.size", n.inp(1)), dt)
        ops.append(
            n.inp(3) if n.has(3) else n.emit("core.range", n.scalar(0, dt), count, n.scalar(1, dt))
        )
    if n.has(4):
        ops.append(n.inp(4))
    return [n.emit("core.slice_dyn", *ops, hint=n.out_hints[0])]


@handles("Gather")
def _gather(n: Node) -> list[Value | None]:
    return [n.emit("core.gather", n.inp(0), n.inp(1), axis=int(n.attr("axis", 0)))]


@handles("GatherElements")
def _gather_el(n: Node) -> list[Value | None]:
    return [n.emit("core.gather_elements", n.inp(0), n.inp(1), axis=int(n.attr("axis", 0)))]


@handles("ScatterElements")
def _scatter_el(n: Node) -> list[Value | None]:
    return [
        n.emit(
            "core.scatter_elements",
            n.inp(0),
            n.inp(1),
            n.inp(2),
            axis=int(n.attr("axis", 0)),
            reduction=n.attr("reduction", "none"),
        )
    ]


@handles("ScatterND")
def _scatter_nd(n: Node) -> list[Value | None]:
    return [
        n.emit(
            "core.scatter_nd", n.inp(0), n.inp(1), n.inp(2), reduction=n.attr("reduction", "none")
        )
    ]


@handles("Expand")
def _expand(n: Node) -> list[Value | None]:
    dims = n.dims(1)
    if dims is not None:
        return [n.emit("core.expand", n.inp(0), shape=tuple(dims))]
    return [n.emit("core.expand_dyn", n.inp(0), n.inp(1), hint=n.out_hints[0])]


def _axes(n: Node, i: int, what: str = "axes") -> list[int] | None:
    """Axes from input i (opset >= 13 style) or the `axes` attribute (older opsets)."""
    if n.has(i):
        return n.ints(i, what)
    a = n.attr("axes")
    return None if a is None else [int(v) for v in a]


@handles("Squeeze")
def _squeeze(n: Node) -> list[Value | None]:
    x = n.inp(0)
    axes = _axes(n, 1)
    if axes is None:
        shape = n.t(0).shape
        if any(not isinstance(d, int) for d in shape):
            raise NotMapped("Squeeze without axes needs a static shape")
        axes = [i for i, d in enumerate(shape) if d == 1]
    return [n.emit("core.squeeze", x, axes=tuple(axes))]


@handles("Unsqueeze")
def _unsqueeze(n: Node) -> list[Value | None]:
    axes = _axes(n, 1)
    if axes is None:
        raise NotMapped("Unsqueeze needs axes")
    return [n.emit("core.unsqueeze", n.inp(0), axes=tuple(axes))]


@handles("Range")
def _range(n: Node) -> list[Value | None]:
    return [n.emit("core.range", n.inp(0), n.inp(1), n.inp(2), hint=n.out_hints[0])]


@handles("Shape")
def _shape(n: Node) -> list[Value | None]:
    attrs: dict[str, Any] = {}
    if n.attr("start") is not None and int(n.attr("start")) != 0:
        attrs["start"] = int(n.attr("start"))
    if n.attr("end") is not None:
        attrs["end"] = int(n.attr("end"))
    return [n.emit("core.shape", n.inp(0), **attrs)]


@handles("Size")
def _size(n: Node) -> list[Value | None]:
    return [n.emit("core.size", n.inp(0))]


@handles("Trilu")
def _trilu(n: Node) -> list[Value | None]:
    ops = [n.inp(0)]
    if n.has(1):
        ops.append(n.inp(1))
    return [n.emit("core.trilu", *ops, upper=bool(n.attr("upper", 1)))]


@handles("CumSum")
def _cumsum(n: Node) -> list[Value | None]:
    axis = n.ints(1, "axis")[0]
    return [
        n.emit(
            "core.cumsum",
            n.inp(0),
            axis=axis,
            exclusive=bool(n.attr("exclusive", 0)),
            reverse=bool(n.attr("reverse", 0)),
        )
    ]


@handles("ArgMax", "ArgMin")
def _arg(n: Node) -> list[Value | None]:
    name = "core.argmax" if n.op_type == "ArgMax" else "core.argmin"
    return [
        n.emit(
            name,
            n.inp(0),
            axis=int(n.attr("axis", 0)),
            keepdims=bool(n.attr("keepdims", 1)),
            select_last_index=bool(n.attr("select_last_index", 0)),
        )
    ]


@handles("TopK")
def _topk(n: Node) -> list[Value | None]:
    k = n.ints(1, "k")[0]
    outs = n.emit_n(
        "core.top_k",
        [n.inp(0)],
        {
            "k": k,
            "axis": int(n.attr("axis", -1)),
            "largest": bool(n.attr("largest", 1)),
            "sorted": bool(n.attr("sorted", 1)),
        },
        2,
    )
    return list(outs)


@handles("Tile")
def _tile(n: Node) -> list[Value | None]:
    return [n.emit("core.tile", n.inp(0), repeats=tuple(n.ints(1, "repeats")))]


@handles("Pad")
def _pad(n: Node) -> list[Value | None]:
    x = n.inp(0)
    rank = _rank(x)
    pads = n.ints(1, "pads") if n.has(1) else [int(p) for p in n.attr("pads", [])]
    if n.has(3):
        axes = [a + rank if a < 0 else a for a in n.ints(3, "axes")]
        full = [0] * (2 * rank)
        for j, a in enumerate(axes):
            full[a] = pads[j]
            full[a + rank] = pads[j + len(axes)]
        pads = full
    value = 0.0
    if n.has(2):
        cv = n.const(2, "constant_value").reshape(-1)
        if cv.size:
            value = cv[0].item()
            value = float(value) if not isinstance(value, bool) else float(value)
    mode = n.attr("mode", "constant")
    return [n.emit("core.pad", x, pads=tuple(pads), mode=mode, value=float(value))]


@handles("ConstantOfShape")
def _const_of_shape(n: Node) -> list[Value | None]:
    val = n.attr("value")
    if val is None:
        val = np.zeros((1,), np.float32)
    dense = DenseAttr(np.asarray(val).reshape(()))
    hint = n.out_hints[0]
    dims = n.dims(0)
    if dims is not None:
        hint = TensorType(tuple(dims), dense.type.dtype)
    return [n.emit("core.constant_of_shape", n.inp(0), value=dense, hint=hint)]


# -- reductions --------------------------------------------------------------------------------

_REDUCE = {
    "ReduceSum": "reduce_sum",
    "ReduceMean": "reduce_mean",
    "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min",
    "ReduceProd": "reduce_prod",
}


def _runtime_axes(n: Node) -> bool:
    """True when the axes are a run-time input of static, non-zero length (core.reduce_*_dyn):
    the result's rank is known whatever their values."""
    axes_from_input = n.op_type == "ReduceSum" and n.opset >= 13 or n.opset >= 18
    if not axes_from_input or not n.has(1) or n.known(1) is not None:
        return False
    t = n.t(1)
    return t.rank == 1 and isinstance(t.shape[0], int) and t.shape[0] > 0


def _reduce_axes(n: Node) -> list[int] | None:
    """The reduction axes; None means 'no-op' (empty axes with noop_with_empty_axes)."""
    axes_from_input = n.op_type == "ReduceSum" and n.opset >= 13 or n.opset >= 18
    if axes_from_input and n.has(1) and n.known(1) is None and n.t(1).shape == (0,):
        axes: list[int] = []  # a run-time input that is always empty
    else:
        axes = (
            (n.ints(1, "axes") if n.has(1) else [])
            if axes_from_input
            else [int(a) for a in (n.attr("axes") or [])]
        )
    if not axes and n.attr("noop_with_empty_axes", 0):
        return None
    return axes


def _reduce(n: Node, kind: str, x: Value) -> Value:
    keep = bool(n.attr("keepdims", 1))
    if _runtime_axes(n):
        return n.emit(f"core.{kind}_dyn", x, n.cast(n.inp(1), DType.i64), keepdims=keep)
    axes = _reduce_axes(n)
    if axes is None:
        return n.emit("core.identity", x)
    return n.emit(f"core.{kind}", x, axes=tuple(axes), keepdims=keep)


@handles(*_REDUCE)
def _reduce_simple(n: Node) -> list[Value | None]:
    return [_reduce(n, _REDUCE[n.op_type], n.inp(0))]


@handles("ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
def _reduce_composite(n: Node) -> list[Value | None]:
    x = n.inp(0)
    op = n.op_type
    if not _runtime_axes(n) and _reduce_axes(n) is None:
        if op == "ReduceSumSquare":
            return [n.emit("core.mul", x, x)]
        if op == "ReduceL1":
            return [n.emit("core.abs", x)]
        if op == "ReduceL2":
            return [n.emit("core.sqrt", n.emit("core.mul", x, x))]
        if op == "ReduceLogSum":
            return [n.emit("core.log", x)]
        return [n.emit("core.identity", x)]
    if op == "ReduceSumSquare":
        return [_reduce(n, "reduce_sum", n.emit("core.mul", x, x))]
    if op == "ReduceL1":
        return [_reduce(n, "reduce_sum", n.emit("core.abs", x))]
    if op == "ReduceL2":
        return [n.emit("core.sqrt", _reduce(n, "reduce_sum", n.emit("core.mul", x, x)))]
    if op == "ReduceLogSum":
        return [n.emit("core.log", _reduce(n, "reduce_sum", x))]
    return [n.emit("core.log", _reduce(n, "reduce_sum", n.emit("core.exp", x)))]


@handles("Softmax", "LogSoftmax")
def _softmax(n: Node) -> list[Value | None]:
    name = "core.softmax" if n.op_type == "Softmax" else "core.log_softmax"
    if n.opset < 13:
        raise NotMapped("Softmax before opset 13 flattens its input; upgrade the model")
    return [n.emit(name, n.inp(0), axis=int(n.attr("axis", -1)))]


# -- normalization ------------------------------------------------------------------------------


def _norm_axes(n: Node, x: Value, axis: int) -> tuple[int, ...]:
    r = _rank(x)
    a = axis + r if axis < 0 else axis
    return tuple(range(a, r))


@handles("LayerNormalization")
def _layer_norm(n: Node) -> list[Value | None]:
    x, w = n.inp(0), n.inp(1)
    eps = float(n.attr("epsilon", 1e-5))
    axes = _norm_axes(n, x, int(n.attr("axis", -1)))
    extra_outputs = any(n.outputs_used[1:])
    if (
        len(axes) == 1
        and not extra_outputs
        and _rank(w) <= 1
        and (not n.has(2) or _rank(n.inp(2)) <= 1)
    ):
        ops = [x, w] + ([n.inp(2)] if n.has(2) else [])
        return [n.emit("llm.layer_norm", *ops, eps=eps), None, None]
    mean = n.emit("core.reduce_mean", x, axes=axes, keepdims=True)
    d = n.emit("core.sub", x, mean)
    var = n.emit("core.reduce_mean", n.emit("core.mul", d, d), axes=axes, keepdims=True)
    inv = n.emit("core.reciprocal", n.emit("core.sqrt", n.emit("core.add", var, n.scalar(eps, x))))
    y = n.emit("core.mul", n.emit("core.mul", d, inv), w)
    if n.has(2):
        y = n.emit("core.add", y, n.inp(2))
    return [y, mean, inv]


@handles("RMSNormalization")
def _rms_norm(n: Node) -> list[Value | None]:
    x, w = n.inp(0), n.inp(1)
    eps = float(n.attr("epsilon", 1e-5))
    axes = _norm_axes(n, x, int(n.attr("axis", -1)))
    if len(axes) == 1 and _rank(w) <= 1:
        return [n.emit("llm.rms_norm", x, w, eps=eps)]
    ms = n.emit("core.reduce_mean", n.emit("core.mul", x, x), axes=axes, keepdims=True)
    inv = n.emit("core.reciprocal", n.emit("core.sqrt", n.emit("core.add", ms, n.scalar(eps, x))))
    return [n.emit("core.mul", n.emit("core.mul", x, inv), w)]


@handles("SimplifiedLayerNormalization")  # onnxruntime registers it in the default domain
@handles("SimplifiedLayerNormalization", domain=MS)
@handles("SimplifiedLayerNormalization", domain="ai.llmir")  # llmir's kernel, the same meaning
def _ms_simplified_ln(n: Node) -> list[Value | None]:
    if any(n.outputs_used[1:]):
        raise NotMapped("the inv_std_var output is not supported")
    axis = int(n.attr("axis", -1))
    if axis not in (-1, _rank(n.inp(0)) - 1):
        raise NotMapped("only the last axis is supported")
    return [n.emit("llm.rms_norm", n.inp(0), n.inp(1), eps=float(n.attr("epsilon", 1e-5))), None]


@handles("SkipSimplifiedLayerNormalization", domain=MS)
@handles("SkipSimplifiedLayerNormalization", domain="ai.llmir")  # llmir's kernel
def _ms_skip_simplified_ln(n: Node) -> list[Value | None]:
    if any(n.outputs_used[1:3]):
        raise NotMapped("the mean and inv_std_var outputs are not supported")
    s = n.emit("core.add", n.inp(0), n.inp(1))
    if n.has(3):
        s = n.emit("core.add", s, n.inp(3))
    y = n.emit("llm.rms_norm", s, n.inp(2), eps=float(n.attr("epsilon", 1e-5)))
    return [y, None, None, s]


@handles("SkipLayerNormalization", domain=MS)
def _ms_skip_ln(n: Node) -> list[Value | None]:
    if any(n.outputs_used[1:3]):
        raise NotMapped("the mean and inv_std_var outputs are not supported")
    s = n.emit("core.add", n.inp(0), n.inp(1))
    if n.has(4):
        s = n.emit("core.add", s, n.inp(4))
    ops = [s, n.inp(2)] + ([n.inp(3)] if n.has(3) else [])
    y = n.emit("llm.layer_norm", *ops, eps=float(n.attr("epsilon", 1e-12)))
    return [y, None, None, s]


# -- rotary embedding ---------------------------------------------------------------------------


def _to_heads(n: Node, x: Value, heads: int) -> Value:
    """[B, S, H*D] -> [B, H, S, D]."""
    t = x.type
    assert isinstance(t, TensorType)
    d = dim_div_exact(t.shape[2], heads)
    if d is DYN:
        raise NotMapped(f"hidden size {t.shape[2]} is not a known multiple of {heads} heads")
    y = n.emit("core.reshape", x, shape=(0, 0, heads, d))
    return n.emit("core.transpose", y, perm=(0, 2, 1, 3))


def _from_heads(n: Node, x: Value) -> Value:
    """[B, H, S, D] -> [B, S, H*D]."""
    y = n.emit("core.transpose", x, perm=(0, 2, 1, 3))
    t = y.type
    assert isinstance(t, TensorType)
    return n.emit("core.reshape", y, shape=(0, 0, dim_mul(t.shape[2], t.shape[3])))


def _rotary(
    n: Node, x4: Value, cos: Value, sin: Value, pos: Value, interleaved: bool, rotary_dim: int
) -> Value:
    return n.emit(
        "llm.rotary_embedding", x4, cos, sin, pos, interleaved=interleaved, rotary_dim=rotary_dim
    )


def _positions_from_offset(n: Node, x4: Value, offset: Value) -> Value:
    """positions[b, s] = offset + s for a [B, H, S, D] tensor."""
    t = x4.type
    assert isinstance(t, TensorType)
    seq = n.emit("core.shape", x4, start=2, end=3)
    seq_s = n.emit("core.squeeze", seq, axes=(0,))
    off = n.emit("core.reshape", n.cast(offset, DType.i64), shape=())
    ar = n.emit("core.range", off, n.emit("core.add", seq_s, off), n.scalar(1, DType.i64))
    pos = n.emit("core.unsqueeze", ar, axes=(0,))
    return n.emit("core.reshape", pos, shape=(1, -1) if t.shape[2] is DYN else (1, t.shape[2]))


@handles("RotaryEmbedding")
def _rotary_23(n: Node) -> list[Value | None]:
    x = n.inp(0)
    r = _rank(x)
    heads = int(n.attr("num_heads", 0))
    interleaved = bool(n.attr("interleaved", 0))
    rdim = int(n.attr("rotary_embedding_dim", 0))
    if r == 3:
        if not heads:
            raise NotMapped("3-D input needs num_heads")
        x4 = _to_heads(n, x, heads)
    elif r == 4:
        x4 = x
    else:
        raise NotMapped(f"input rank {r} (expected 3 or 4)")
    cos, sin = n.inp(1), n.inp(2)
    if n.has(3):
        pos = n.cast(n.inp(3), DType.i64)
    else:
        # caches are [B, S, R/2] already gathered: index them with positions b*S + s
        ct = n.t(1)
        if ct.rank != 3:
            raise NotMapped("without position_ids the caches must be [batch, seq, rotary_dim/2]")
        cos = n.emit("core.reshape", cos, shape=(-1, ct.shape[2]))
        sin = n.emit("core.reshape", sin, shape=(-1, ct.shape[2]))
        b_s = n.emit("core.shape", n.inp(1), start=0, end=2)
        total = n.emit("core.reduce_prod", b_s, axes=(0,), keepdims=False)
        flat = n.emit("core.range", n.scalar(0, DType.i64), total, n.scalar(1, DType.i64))
        pos = n.emit(
            "core.reshape_dyn", flat, b_s, hint=TensorType((ct.shape[0], ct.shape[1]), DType.i64)
        )
    y = _rotary(n, x4, cos, sin, pos, interleaved, rdim)
    return [_from_heads(n, y) if r == 3 else y]


@handles("RotaryEmbedding", domain=MS)
def _rotary_ms(n: Node) -> list[Value | None]:
    x = n.inp(0)
    r = _rank(x)
    heads = int(n.attr("num_heads", 0))
    if n.attr("is_packed_batching", 0):
        raise NotMapped("packed batching is not supported")
    if float(n.attr("scale", 1.0)) != 1.0:
        raise NotMapped("scale != 1 is not supported")
    if r == 3:
        t = n.t(0)
        d = n.t(2).shape[1]
        if not heads:
            rd = int(n.attr("rotary_embedding_dim", 0))
            if rd:
                raise NotMapped("3-D input with rotary_embedding_dim needs num_heads")
            if not isinstance(d, int) or not isinstance(t.shape[2], int):
                raise NotMapped("3-D input needs num_heads or static sizes")
            heads = t.shape[2] // (2 * d)
        x4 = _to_heads(n, x, heads)
    elif r == 4:
        x4 = x  # contrib 4-D layout is [B, N, S, H] like ONNX-23's
    else:
        raise NotMapped(f"input rank {r}")
    pt = n.t(1)
    pos = n.cast(n.inp(1), DType.i64)
    if pt.rank == 1:
        pos = _positions_from_offset(n, x4, pos)
    y = _rotary(
        n,
        x4,
        n.inp(2),
        n.inp(3),
        pos,
        bool(n.attr("interleaved", 0)),
        int(n.attr("rotary_embedding_dim", 0)),
    )
    return [_from_heads(n, y) if r == 3 else y]


# -- attention ----------------------------------------------------------------------------------


def _static(d: Dim) -> int | None:
    return d if isinstance(d, int) else None


def _neg_inf_bias(n: Node, mask: Value, like: Value) -> Value:
    """Boolean keep-mask -> additive 0 / -inf bias of like's dtype."""
    return n.emit("core.where", mask, n.scalar(0, like), n.scalar(-math.inf, like))


def _top_left_causal(n: Node, q: Value, k: Value) -> Value:
    """bool [Sq, Skv] mask, query i sees key j iff j <= i (ONNX is_causal without a cache)."""
    qs = n.emit("core.shape", q, start=2, end=3)
    ks = n.emit("core.shape", k, start=2, end=3)
    shape = n.emit("core.concat", qs, ks, axis=0)
    qt, kt = q.type, k.type
    assert isinstance(qt, TensorType) and isinstance(kt, TensorType)
    ones = n.emit(
        "core.constant_of_shape",
        shape,
        value=DenseAttr(np.array(True)),
        hint=TensorType((qt.shape[2], kt.shape[2]), DType.bool),
    )
    return n.emit("core.trilu", ones, upper=False)


def _seq_len(n: Node, x: Value, axis: int) -> Value:
    """x's size along axis as an i64 scalar (a constant when static)."""
    t = x.type
    assert isinstance(t, TensorType)
    d = t.shape[axis]
    if isinstance(d, int):
        return n.scalar(d, DType.i64)
    return n.emit("core.squeeze", n.emit("core.shape", x, start=axis, end=axis + 1), axes=(0,))


def _arange(n: Node, x: Value, axis: int) -> Value:
    t = x.type
    assert isinstance(t, TensorType)
    d = t.shape[axis]
    if isinstance(d, int):
        return n.array(np.arange(d), DType.i64)
    return n.emit(
        "core.range",
        n.scalar(0, DType.i64),
        _seq_len(n, x, axis),
        n.scalar(1, DType.i64),
        hint=TensorType((d,), DType.i64),
    )


def _pad_mask(n: Node, mask: Value, k: Value) -> Value:
    """ONNX pads an attn_mask shorter than the keys with -inf (or False)."""
    mt, kt = mask.type, k.type
    assert isinstance(mt, TensorType) and isinstance(kt, TensorType)
    skv, ml = _static(kt.shape[2]), _static(mt.shape[-1])
    if skv is not None and ml is not None:
        if ml < skv:
            pads = [0] * (2 * mt.rank)
            pads[2 * mt.rank - 1] = skv - ml
            fill = 0.0 if mt.dtype == DType.bool else -math.inf
            return n.emit("core.pad", mask, pads=tuple(pads), mode="constant", value=fill)
        return mask
    if mt.shape[-1] != kt.shape[2]:
        raise NotMapped("attn_mask's length must match the keys' when sizes are dynamic")
    return mask


def _attention_general(
    n: Node, q: Value, k: Value, v: Value, mask: Value | None, past: bool, nonpad: Value | None
) -> tuple[Value, Value | None]:
    """ONNX Attention in core ops, step for step as the ONNX reference computes it."""
    dt = _dtype(q)
    qt = n.t(0) if _rank(n.inp(0)) == 4 else q.type
    assert isinstance(qt, TensorType)
    d = qt.shape[3]
    scale = n.attr("scale")
    if scale is None:
        if not isinstance(d, int):
            raise NotMapped("the default scale needs a static head size")
        scale = 1.0 / math.sqrt(d)
    sq = n.scalar(math.sqrt(float(scale)), dt)
    qs, ks = n.emit("core.mul", q, sq), n.emit("core.mul", k, sq)
    hq, hk = _t_of(q).shape[1], _t_of(k).shape[1]
    if hq != hk:
        if not isinstance(hq, int) or not isinstance(hk, int) or hq % hk:
            raise NotMapped("grouped-query attention needs static head counts")
        idx = n.array(np.arange(hq) // (hq // hk), DType.i64)
        ks, v = n.emit("core.gather", ks, idx, axis=1), n.emit("core.gather", v, idx, axis=1)
    s = n.emit("core.matmul", qs, ks, transpose_b=True)
    softcap = float(n.attr("softcap", 0.0) or 0.0)
    if softcap > 0:
        cap = n.scalar(softcap, dt)
        s = n.emit("core.mul", n.emit("core.tanh", n.emit("core.div", s, cap)), cap)
    zero, ninf = n.scalar(0, dt), n.scalar(-math.inf, dt)
    bias: Value | None = None
    if mask is not None:
        mask = _pad_mask(n, mask, k)
        bias = (
            n.emit("core.where", mask, zero, ninf)
            if _dtype(mask) == DType.bool
            else n.cast(mask, dt)
        )
    bias = _position_bias(n, q, k, past, nonpad, zero, ninf, bias)
    mode = int(n.attr("qk_matmul_output_mode", 0))
    sb = s if bias is None else n.emit("core.add", s, bias)
    qk_out = sb if mode == 2 else s
    prec = n.attr("softmax_precision")
    if prec is not None:
        sb = n.cast(sb, n.imp.dtype_of_onnx(prec))
    p = n.emit("core.softmax", sb, axis=-1)
    if bias is not None:
        # rows whose bias masks every key give all-zero probabilities (ONNX's fully-masked rule)
        bmax = n.emit("core.reduce_max", bias, axes=(-1,), keepdims=True)
        dead = n.emit("core.equal", bmax, n.scalar(-math.inf, _dtype(bias)))
        p = n.emit("core.where", dead, n.scalar(0, _dtype(p)), p)
    if mode == 3:
        qk_out = p
    y = n.emit("core.matmul", n.cast(p, dt), v)
    return y, n.cast(qk_out, dt)


def _position_bias(
    n: Node,
    q: Value,
    k: Value,
    past: bool,
    nonpad: Value | None,
    zero: Value,
    ninf: Value,
    bias: Value | None,
) -> Value | None:
    """`bias` plus the additive bias (0 or -inf) of the causal mask and the sliding window, then
    of the padded keys past each sequence's length (as many as the node asks for). A query's
    position counts from the past length, or from its sequence's non-pad length."""
    i_idx = n.emit("core.unsqueeze", _arange(n, q, 2), axes=(1,))  # [Sq, 1]
    j_idx = n.emit("core.unsqueeze", _arange(n, k, 2), axes=(0,))  # [1, Skv]
    if past:
        offset = _seq_len(n, n.inp(4), 2)
    elif nonpad is not None:
        offset = n.emit(
            "core.reshape",
            n.emit("core.sub", n.cast(nonpad, DType.i64), _seq_len(n, q, 2)),
            shape=(-1, 1, 1, 1),
        )
    else:
        offset = n.scalar(0, DType.i64)
    pos = n.emit("core.add", i_idx, offset)  # [Sq, 1] or [B, 1, Sq, 1]
    allowed: Value | None = None
    if n.attr("is_causal", 0):
        allowed = n.emit("core.less_equal", j_idx, pos)
    left, right = int(n.attr("left_window_size", -1)), int(n.attr("right_window_size", -1))
    if left >= 0 or right >= 0:
        diff = n.emit("core.sub", pos, j_idx)
        for bound, value in ((left, diff), (right, n.emit("core.neg", diff))):
            if bound >= 0:
                ok = n.emit("core.less_equal", value, n.scalar(bound, DType.i64))
                allowed = ok if allowed is None else n.emit("core.and", allowed, ok)
    if allowed is not None:
        extra = n.emit("core.where", allowed, zero, ninf)
        bias = extra if bias is None else n.emit("core.add", bias, extra)
    if nonpad is not None:
        jb = n.emit("core.unsqueeze", _arange(n, k, 2), axes=(0,))
        keep = n.emit(
            "core.less", jb, n.emit("core.unsqueeze", n.cast(nonpad, DType.i64), axes=(1,))
        )
        keep = n.emit("core.unsqueeze", keep, axes=(1, 2))  # [B, 1, 1, Skv]
        extra = n.emit("core.where", keep, zero, ninf)
        bias = extra if bias is None else n.emit("core.add", bias, extra)
    return bias


def _t_of(v: Value) -> TensorType:
    t = v.type
    assert isinstance(t, TensorType)
    return t


@handles("Attention")
def _attention(n: Node) -> list[Value | None]:
    q, k, v = n.inp(0), n.inp(1), n.inp(2)
    rank = _rank(q)
    if rank == 3:
        hq, hkv = int(n.attr("q_num_heads", 0)), int(n.attr("kv_num_heads", 0))
        if not hq or not hkv:
            raise NotMapped("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _to_heads(n, q, hq), _to_heads(n, k, hkv), _to_heads(n, v, hkv)
    elif rank != 4:
        raise NotMapped(f"input rank {rank}")
    past = n.has(4) and n.has(5)
    if past:
        k = n.emit("core.concat", n.inp(4), k, axis=2)
        v = n.emit("core.concat", n.inp(5), v, axis=2)
    nonpad = n.inp(6) if n.has(6) else None
    mask = n.inp(3) if n.has(3) else None
    general = (
        nonpad is not None
        or n.attr("left_window_size", -1) != -1
        or n.attr("right_window_size", -1) != -1
        or (n.num_outputs > 3 and n.outputs_used[3])
    )
    qk_out: Value | None = None
    if general:
        y, qk_out = _attention_general(n, q, k, v, mask, past, nonpad)
    else:
        y = _attention_sdpa(n, q, k, v, mask, past)
    if rank == 3:
        y = _from_heads(n, y)
    outs: list[Value | None] = [y, k if past else None, v if past else None, qk_out]
    return outs[: max(n.num_outputs, 1)]


def _attention_sdpa(n: Node, q: Value, k: Value, v: Value, mask: Value | None, past: bool) -> Value:
    qt, kt = _t_of(q), _t_of(k)
    if mask is not None:
        mask = _pad_mask(n, mask, k)
    attrs: dict[str, Any] = {}
    scale = n.attr("scale")
    if scale is not None:
        attrs["scale"] = float(scale)
    softcap = float(n.attr("softcap", 0.0) or 0.0)
    if softcap:
        attrs["softcap"] = softcap
    # ONNX aligns the causal mask to the cache (offset = past length); llmir's causal aligns
    # the query block to the end of the keys: the same exactly when Skv = past + Sq.
    if n.attr("is_causal", 0):
        if past or (qt.shape[2] == kt.shape[2] and qt.shape[2] is not DYN):
            attrs["causal"] = True
        else:
            tl = _top_left_causal(n, q, k)
            if mask is None:
                mask = tl
            elif _dtype(mask) == DType.bool:
                mask = n.emit("core.and", mask, tl)
            else:
                mask = n.emit("core.add", n.cast(mask, _dtype(q)), _neg_inf_bias(n, tl, q))
    if mask is not None and _dtype(mask) not in (DType.bool, _dtype(q)):
        mask = n.cast(mask, _dtype(q))
    ops = [q, k, v] + ([mask] if mask is not None else [])
    return n.emit("llm.scaled_dot_product_attention", *ops, **attrs)


@handles("GroupQueryAttention", domain=MS)
def _gqa(n: Node) -> list[Value | None]:
    return _gqa_node(n, qkv_bias=False)


def _gqa_node(n: Node, qkv_bias: bool) -> list[Value | None]:
    """GroupQueryAttention's meaning; qkv_bias: input 14 (llmir's) is added to the packed qkv."""
    hq, hkv = int(n.attr("num_heads")), int(n.attr("kv_num_heads"))
    if int(n.attr("local_window_size", -1)) != -1 or n.attr("smooth_softmax", 0):
        raise NotMapped("local_window_size and smooth_softmax are not supported")
    if n.has(10) or n.has(11):
        raise NotMapped("attention_bias / head_sink inputs are not supported")
    if n.has(1) != n.has(2):
        raise NotMapped(
            "key and value must both be given (unpacked) or both be absent (packed QKV)"
        )
    if n.has(1):
        q_in, k_in, v_in = n.inp(0), n.inp(1), n.inp(2)
    else:  # packed: query holds [q | k | v] along the hidden axis, (hq + 2 hkv) heads of head_size
        width = n.t(0).shape[-1]
        if not isinstance(width, int) or width % (hq + 2 * hkv):
            raise NotMapped(
                f"packed QKV width {width} is not a multiple of num_heads + 2 * kv_num_heads"
            )
        hd = width // (hq + 2 * hkv)
        qkv = n.emit("core.add", n.inp(0), n.inp(14)) if qkv_bias else n.inp(0)
        q_in, k_in, v_in = n.emit_n(
            "core.split", [qkv], {"axis": -1, "sizes": (hq * hd, hkv * hd, hkv * hd)}, 3
        )
    q, k, v = _to_heads(n, q_in, hq), _to_heads(n, k_in, hkv), _to_heads(n, v_in, hkv)
    if n.attr("do_rotary", 0):
        # positions: past_len + s for every batch row (no left padding)
        if n.has(3):
            past_len = n.emit(
                "core.squeeze", n.emit("core.shape", n.inp(3), start=2, end=3), axes=(0,)
            )
        else:
            past_len = n.scalar(0, DType.i64)
        pos = _positions_from_offset(n, q, past_len)
        inter = bool(n.attr("rotary_interleaved", 0))
        q = _rotary(n, q, n.inp(7), n.inp(8), pos, inter, 0)
        k = _rotary(n, k, n.inp(7), n.inp(8), pos, inter, 0)
    if n.has(3) and n.has(4):
        k = n.emit("core.concat", n.inp(3), k, axis=2)
        v = n.emit("core.concat", n.inp(4), v, axis=2)
    attrs: dict[str, Any] = {"causal": True}
    if float(n.attr("scale", 0.0) or 0.0):
        attrs["scale"] = float(n.attr("scale"))
    if float(n.attr("softcap", 0.0) or 0.0):
        attrs["softcap"] = float(n.attr("softcap"))
    y = n.emit("llm.scaled_dot_product_attention", q, k, v, **attrs)
    return [_from_heads(n, y), k, v]


@handles("GroupQueryAttention", domain="ai.llmir")
def _llmir_gqa(n: Node) -> list[Value | None]:
    """llmir's own attention (in a model.onnx llmir built): com.microsoft GroupQueryAttention's
    inputs, attributes and meaning, plus input 14, a bias added to the packed q|k|v."""
    if n.has(14) and n.has(1):
        raise NotMapped("a qkv bias (input 14) takes the packed form")
    return _gqa_node(n, qkv_bias=n.has(14))


# -- quantized matmul ----------------------------------------------------------------------------


def _as_shape(n: Node, i: int, shape: tuple[int, ...]) -> Value:
    """Input i viewed with a new static shape: the initializer's bytes retyped, else a reshape."""
    t = n.t(i)
    if t.static_shape() == shape:
        return n.inp(i)
    init = n.imp.reshaped_initializer(n.input_names[i], TensorType(shape, t.dtype))
    return init if init is not None else n.emit("core.reshape", n.inp(i), shape=shape)


@handles("MatMulNBits", domain=MS)
def _matmul_nbits(n: Node) -> list[Value | None]:
    bits, block = int(n.attr("bits", 4)), int(n.attr("block_size"))
    kk, nn = int(n.attr("K")), int(n.attr("N"))
    if n.has(4):
        raise NotMapped("g_idx is not supported")
    if kk % block:
        raise NotMapped(f"K={kk} is not a multiple of block_size={block}")
    st = n.t(2)
    if not isinstance(st.dtype, DType) or not st.dtype.is_float:
        raise NotMapped("scales must be a float tensor")
    if n.has(3) and n.t(3).dtype != DType.u8:
        raise NotMapped("float zero points are not supported")
    nb = kk // block
    q = QuantType("nbits", bits, block, st.dtype, "int" if n.has(3) else "none")
    w = n.imp.requantized_weight(n.input_names[1], TensorType((nn, kk), q))
    ops = [n.inp(0), w, _as_shape(n, 2, (nn, nb))]
    if n.has(3):
        ops.append(_as_shape(n, 3, (nn, (nb * bits + 7) // 8)))
    # the node's activation precision is kept (absent: the build chooses)
    level = n.attr("accuracy_level")
    keep: dict[str, Any] = {} if level is None else {"accuracy_level": int(level)}
    y = n.emit("llm.quantized_matmul", *ops, transpose_b=True, **keep)
    if n.has(5):
        y = n.emit("core.add", y, n.inp(5))
    return [y]


@handles("MatMulNBitsQ4", "MatMulNBitsQ8", domain="ai.llmir")
def _llmir_matmul_nbits(n: Node) -> list[Value | None]:
    """llmir's own block-quantized matmul (in a model.onnx llmir built): MatMulNBits' inputs
    (B [N, K/32, 32*bits/8], scales f32 or f16, optional zero points), block 32, int8
    activations (accuracy_level 4)."""
    bits = 4 if n.op_type.endswith("Q4") else 8
    bt, st = n.t(1), n.t(2)
    shape = bt.static_shape()
    if shape is None or len(shape) != 3 or shape[2] != 4 * bits:
        raise NotMapped(f"B must be a static [N, K/32, {4 * bits}] tensor")
    if not isinstance(st.dtype, DType) or not st.dtype.is_float:
        raise NotMapped("scales must be a float tensor")
    nn, nb = int(shape[0]), int(shape[1])
    q = QuantType("nbits", bits, 32, st.dtype, "int" if n.has(3) else "none")
    w = n.imp.requantized_weight(n.input_names[1], TensorType((nn, nb * 32), q))
    ops = [n.inp(0), w, _as_shape(n, 2, (nn, nb))]
    if n.has(3):
        ops.append(_as_shape(n, 3, (nn, (nb * bits + 7) // 8)))
    y = n.emit("llm.quantized_matmul", *ops, transpose_b=True, accuracy_level=4)
    return [_llmir_epilogue(n, y, nn)]


def _llmir_epilogue(n: Node, y: Value, nn: int) -> Value:
    """The `epilogue` attribute of llmir's quantized matmuls: "swiglu" (the weight is [W_gate;
    W_up]) gives silu(y[..., :N/2]) * y[..., N/2:]."""
    epi = n.attr("epilogue")
    epi = epi.decode() if isinstance(epi, bytes) else epi
    if epi in (None, "", "none"):
        return y
    if epi != "swiglu" or nn % 2:
        raise NotMapped(f"epilogue {epi!r} (N = {nn}) is not a SwiGLU over an even N")
    g = n.emit("core.slice", y, starts=(0,), ends=(nn // 2,), axes=(-1,))
    u = n.emit("core.slice", y, starts=(nn // 2,), ends=(nn,), axes=(-1,))
    return n.emit("llm.silu_mul", g, u)


# -- QDQ quantization (DequantizeLinear / QuantizeLinear and the integer matmuls) ----------------


def _q_range(dt: DType) -> tuple[float, float] | None:
    """(min, max) of a fixed-point quantized type; None for float8/float4 (cast semantics)."""
    if not dt.is_int:
        return None
    import ml_dtypes

    info = ml_dtypes.iinfo(numpy_dtype(dt))  # type: ignore[no-untyped-call]
    return float(info.min), float(info.max)


def _q_param(n: Node, p: Value, x: Value, axis: int, block: int, dt: DType) -> Value:
    """A scale or zero point, as `dt`, shaped to broadcast against x: a scalar (per tensor), a
    1-D per-`axis` vector, or a blocked tensor (x's rank, `axis` divided into blocks of `block`
    elements), whose entries are repeated `block` times along `axis` and cut to x's length."""
    p = n.cast(p, dt)
    r, xr = _rank(p), _rank(x)
    if r == 0 or (r == 1 and block <= 0 and _static_len(p) == 1 and xr != 1):
        return n.emit("core.reshape", p, shape=()) if r else p
    axis = axis % xr
    if block > 0:
        xt = x.type
        assert isinstance(xt, TensorType)
        d = xt.shape[axis]
        if not isinstance(d, int):
            raise NotMapped("blocked quantization needs a static size along the block axis")
        idx = n.array(np.arange(d) // block, DType.i64)
        return n.emit("core.gather", p, idx, axis=axis)
    if r != 1:
        raise NotMapped(f"a quantization parameter of rank {r} without block_size")
    shape = [1] * xr
    shape[axis] = -1
    return n.emit("core.reshape", p, shape=tuple(shape))


def _static_len(v: Value) -> int | None:
    t = v.type
    if isinstance(t, TensorType) and t.rank == 1 and isinstance(t.shape[0], int):
        return t.shape[0]
    return None


def _dequantize(n: Node, x: Value, scale: Value, zp: Value | None, out: DType) -> Value:
    axis, block = int(n.attr("axis", 1)), int(n.attr("block_size", 0))
    xf = n.cast(x, DType.f32)
    if zp is not None and _dtype(zp).is_int:
        xf = n.emit("core.sub", xf, _q_param(n, zp, x, axis, block, DType.f32))
    y = n.emit("core.mul", xf, _q_param(n, scale, x, axis, block, DType.f32))
    return n.cast(y, out)


def _quantize(n: Node, x: Value, scale: Value, zp: Value | None, to: DType) -> Value:
    axis, block = int(n.attr("axis", 1)), int(n.attr("block_size", 0))
    xf = n.cast(x, DType.f32)
    y = n.emit("core.div", xf, _q_param(n, scale, x, axis, block, DType.f32))
    rng = _q_range(to)
    if rng is None:  # float8 / float4: a (saturating, by default) cast
        return _cast_to(n, y, to)
    y = n.emit("core.round", y)  # half to even, as the spec says
    if zp is not None:
        y = n.emit("core.add", y, _q_param(n, zp, x, axis, block, DType.f32))
    y = n.emit("core.max", n.emit("core.min", y, n.scalar(rng[1], y)), n.scalar(rng[0], y))
    return n.emit("core.cast", y, to=to)


@handles("DequantizeLinear")
def _dequantize_linear(n: Node) -> list[Value | None]:
    """y = (x - zero_point) * scale, per tensor, per axis or per block; the result has the
    scale's dtype (or `output_dtype`)."""
    out = _dtype(n.inp(1))
    if n.attr("output_dtype", 0):
        out = n.imp.dtype_of_onnx(n.attr("output_dtype"))
    zp = n.inp(2) if n.has(2) else None
    return [_dequantize(n, n.inp(0), n.inp(1), zp, out)]


@handles("QuantizeLinear")
def _quantize_linear(n: Node) -> list[Value | None]:
    """y = saturate(round_half_even(x / scale) + zero_point) for fixed-point outputs, or a cast
    of x / scale (saturating unless saturate=0) for float8/float4 ones; the output has the zero
    point's dtype (or `output_dtype`, else uint8)."""
    if n.has(2):
        to = _dtype(n.inp(2))
    elif n.attr("output_dtype", 0):
        to = n.imp.dtype_of_onnx(n.attr("output_dtype"))
    else:
        to = DType.u8
    zp = n.inp(2) if n.has(2) and to.is_int else None
    return [_quantize(n, n.inp(0), n.inp(1), zp, to)]


@handles("DynamicQuantizeLinear")
def _dynamic_quantize_linear(n: Node) -> list[Value | None]:
    """uint8 quantization with a scale and zero point computed from x's range (widened to
    include 0): scale = (max - min) / 255, zero_point = saturate(round(-min / scale))."""
    return _dql(n, n.cast(n.inp(0), DType.f32))  # type: ignore[return-value]


@handles("DynamicQuantizeMatMul", domain=MS)
def _dynamic_quantize_matmul(n: Node) -> list[Value | None]:
    """DynamicQuantizeLinear of A, then (qa - za) @ (B - b_zero_point) in int32, times
    a_scale * b_scale (per tensor or per column), plus bias: exactly what onnxruntime computes
    (llmir's int8 artifacts store their projections this way)."""
    qa, sa, za = _dql(n, n.cast(n.inp(0), DType.f32))
    a = n.emit("core.sub", n.cast(qa, DType.i32), n.cast(za, DType.i32))
    b = n.cast(n.inp(1), DType.i32)
    if n.has(3):
        b = n.emit("core.sub", b, n.cast(n.inp(3), DType.i32))
    acc = n.cast(n.emit("core.matmul", a, b), DType.f32)
    y = n.emit("core.mul", acc, n.emit("core.mul", sa, n.cast(n.inp(2), DType.f32)))
    if n.has(4):
        y = n.emit("core.add", y, n.inp(4))
    return [y]


@handles("MatMulF32", domain="ai.llmir")
def _matmul_f32(n: Node) -> list[Value | None]:
    """llmir's own f32 matmul (llmir_core/targets/onnxruntime/native/matmul_f32.c): X @ W^T with W stored
    as rows [N, K], or as 16-row panels [ceil(N/16), K, 16] (attribute N; rows past N are zero
    padding), unpacked to [N, K] exactly; `epilogue = "swiglu"` as for the quantized ones."""
    wt, xt = n.t(1), n.t(0)
    if wt.dtype != DType.f32 or xt.dtype != DType.f32:
        raise NotMapped("expects f32 X and W")
    if wt.rank == 2:
        y = n.emit("core.matmul", n.inp(0), n.inp(1), transpose_b=True)
        rows = wt.shape[0]
        return [_llmir_epilogue(n, y, rows if isinstance(rows, int) else -1)]  # -1: not static
    nn, shape = n.attr("N", None), wt.shape
    k = xt.shape[-1] if xt.rank else None
    if (
        wt.rank != 3
        or not isinstance(nn, int)
        or not isinstance(k, int)
        or tuple(shape) != (-(-nn // 16), k, 16)
    ):
        raise NotMapped(f"W {list(shape)} is not [N, K] or [ceil(N/16), K, 16] with attribute N")
    p = -(-nn // 16)
    w = n.emit("core.transpose", n.inp(1), perm=(0, 2, 1))
    w = n.emit("core.reshape", w, shape=(p * 16, k))
    if p * 16 != nn:
        w = n.emit("core.slice", w, starts=(0,), ends=(nn,), axes=(0,))
    return [_llmir_epilogue(n, n.emit("core.matmul", n.inp(0), w, transpose_b=True), nn)]


@handles("MatMulS8", domain="ai.llmir")
def _matmul_s8(n: Node) -> list[Value | None]:
    """llmir's own int8 matmul (llmir_core/targets/onnxruntime/native/matmul_s8.c): X @ (codes * S)^T with
    the codes W [ceil(N/4), ceil(K/32), 4, 32] (rows interleaved by 4, zero-padded) unpacked and
    dequantized exactly. The kernel also rounds X per 32 columns at run time (int8 with at most
    4 rows, 7-bit codes with a zero point with more: llmir_core/quant/s8.py); that rounding is
    not reproduced: the imported module multiplies X as it is."""
    wt, st, xt = n.t(1), n.t(2), n.t(0)
    k, shape = xt.shape[-1] if xt.rank else None, wt.shape
    if wt.dtype != DType.i8 or wt.rank != 4 or st.rank != 1 or not isinstance(k, int):
        raise NotMapped("expects X [..., K] with a static K, W int8 [N/4, K/32, 4, 32], S [N]")
    nn = st.shape[0]
    if not isinstance(nn, int) or tuple(shape) != (-(-nn // 4), -(-k // 32), 4, 32):
        raise NotMapped(f"W {list(shape)} is not [ceil(N/4), ceil(K/32), 4, 32] for N={nn}, K={k}")
    g, kb = -(-nn // 4), -(-k // 32)
    w = n.emit("core.transpose", n.inp(1), perm=(0, 2, 1, 3))
    w = n.emit("core.reshape", w, shape=(g * 4, kb * 32))
    if (g * 4, kb * 32) != (nn, k):
        w = n.emit("core.slice", w, starts=(0, 0), ends=(nn, k), axes=(0, 1))
    scales = n.emit("core.unsqueeze", n.cast(n.inp(2), DType.f32), axes=(-1,))
    w = n.emit("core.mul", n.cast(w, DType.f32), scales)
    y = n.emit("core.matmul", n.cast(n.inp(0), DType.f32), w, transpose_b=True)
    return [_llmir_epilogue(n, y, nn)]


def _dql(n: Node, x: Value) -> list[Value]:
    """(uint8 codes, scale, zero point) of DynamicQuantizeLinear over f32 x."""
    axes = tuple(range(_rank(x)))
    zero = n.scalar(0.0, x)
    lo = n.emit("core.min", n.emit("core.reduce_min", x, axes=axes, keepdims=False), zero)
    hi = n.emit("core.max", n.emit("core.reduce_max", x, axes=axes, keepdims=False), zero)
    scale = n.emit("core.div", n.emit("core.sub", hi, lo), n.scalar(255.0, x))
    zpf = n.emit("core.round", n.emit("core.sub", zero, n.emit("core.div", lo, scale)))
    zpf = n.emit("core.max", n.emit("core.min", zpf, n.scalar(255.0, x)), zero)
    zp = n.emit("core.cast", zpf, to=DType.u8)
    y = n.emit("core.round", n.emit("core.div", x, scale))
    y = n.emit("core.add", y, zpf)
    y = n.emit("core.max", n.emit("core.min", y, n.scalar(255.0, x)), zero)
    return [n.emit("core.cast", y, to=DType.u8), scale, zp]


def _int_operand(n: Node, i: int, zp_index: int, row_axis: bool) -> Value:
    """Input i as int32 minus its zero point (a scalar, or per row of A / per column of B)."""
    v = n.cast(n.inp(i), DType.i32)
    if not n.has(zp_index):
        return v
    zp = n.cast(n.inp(zp_index), DType.i32)
    if _rank(zp) == 1 and row_axis and _static_len(zp) != 1:
        zp = n.emit("core.unsqueeze", zp, axes=(-1,))
    return n.emit("core.sub", v, zp)


@handles("MatMulInteger")
def _matmul_integer(n: Node) -> list[Value | None]:
    """(A - a_zero_point) @ (B - b_zero_point), exactly, in int32."""
    a = _int_operand(n, 0, 2, row_axis=True)
    b = _int_operand(n, 1, 3, row_axis=False)
    return [n.emit("core.matmul", a, b)]


@handles("QLinearMatMul")
def _qlinear_matmul(n: Node) -> list[Value | None]:
    """quantize(dequantize(a) @ dequantize(b), y_scale, y_zero_point), in float32."""
    a = n.emit(
        "core.mul",
        n.emit("core.sub", n.cast(n.inp(0), DType.f32), _row_param(n, n.inp(2))),
        _row_param(n, n.inp(1)),
    )
    b = n.emit(
        "core.mul",
        n.emit("core.sub", n.cast(n.inp(3), DType.f32), n.cast(n.inp(5), DType.f32)),
        n.cast(n.inp(4), DType.f32),
    )
    y = n.emit("core.matmul", a, b)
    to = _dtype(n.inp(7))
    q = n.emit("core.round", n.emit("core.div", y, n.cast(n.inp(6), DType.f32)))
    q = n.emit("core.add", q, n.cast(n.inp(7), DType.f32))
    rng = _q_range(to)
    assert rng is not None
    q = n.emit("core.max", n.emit("core.min", q, n.scalar(rng[1], q)), n.scalar(rng[0], q))
    return [n.emit("core.cast", q, to=to)]


def _row_param(n: Node, p: Value) -> Value:
    p = n.cast(p, DType.f32)
    if _rank(p) == 1 and _static_len(p) != 1:
        p = n.emit("core.unsqueeze", p, axes=(-1,))
    return p


# -- GatherND, TensorScatter, Einsum (decomposed; static shapes) -------------------------------


def _static_shape_of(n: Node, v: Value, what: str) -> tuple[int, ...]:
    t = v.type
    assert isinstance(t, TensorType)
    shape = t.static_shape()
    if shape is None:
        raise NotMapped(f"{n.op_type} needs a static shape for its {what}")
    return tuple(shape)


@handles("GatherND")
def _gather_nd(n: Node) -> list[Value | None]:
    """Index tuples into data's dims b..b+K-1 (b = batch_dims) become linear indices into data
    reshaped to [batch * those dims, rest...], gathered along axis 0."""
    data, idx = n.inp(0), n.cast(n.inp(1), DType.i64)
    b = int(n.attr("batch_dims", 0))
    ds = _static_shape_of(n, data, "data")
    ishape = _static_shape_of(n, idx, "indices")
    k = ishape[-1]
    if not 1 <= k <= len(ds) - b:
        raise NotMapped(f"GatherND index tuples of length {k} for data of rank {len(ds)}")
    lead = ishape[:-1]
    lin: Value | None = None
    stride = 1
    for j in reversed(range(k)):
        d = ds[b + j]
        ij = n.emit("core.gather", idx, n.array(j, DType.i64), axis=-1)
        neg = n.emit("core.less", ij, n.scalar(0, ij))
        ij = n.emit("core.where", neg, n.emit("core.add", ij, n.scalar(d, ij)), ij)
        term = n.emit("core.mul", ij, n.scalar(stride, ij)) if stride != 1 else ij
        lin = term if lin is None else n.emit("core.add", lin, term)
        stride *= d
    assert lin is not None
    if b:
        nb = int(np.prod(ds[:b]))
        base = np.arange(nb, dtype=np.int64).reshape(ds[:b] + (1,) * (len(lead) - b)) * stride
        lin = n.emit("core.add", lin, n.array(base, DType.i64))
    rows = int(np.prod(ds[: b + k]))
    flat = n.emit("core.reshape", data, shape=(rows, *ds[b + k :]))
    return [n.emit("core.gather", flat, lin, axis=0)]


@handles("TensorScatter")
def _tensor_scatter(n: Node) -> list[Value | None]:
    """present = past with `update` written along `axis` from write_indices[batch] (0 when
    absent; modulo the cache length when mode is 'circular'), as a ScatterElements."""
    past, upd = n.inp(0), n.inp(1)
    ps = _static_shape_of(n, past, "past cache")
    us = _static_shape_of(n, upd, "update")
    axis = int(n.attr("axis", -2)) % len(ps)
    mode = n.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise NotMapped(f"TensorScatter mode '{mode}'")
    shape = [1] * len(us)
    shape[axis] = us[axis]
    pos = n.array(np.arange(us[axis], dtype=np.int64).reshape(shape), DType.i64)
    if n.has(2):
        w = n.cast(n.inp(2), DType.i64)
        wshape = [1] * len(us)
        wshape[0] = -1
        pos = n.emit("core.add", pos, n.emit("core.reshape", w, shape=tuple(wshape)))
    if mode == "circular":
        pos = n.emit("core.mod", pos, n.scalar(ps[axis], pos))
    pos = n.emit("core.expand", pos, shape=us)
    return [n.emit("core.scatter_elements", past, pos, upd, axis=axis, reduction="none")]


def _einsum_terms(eq: str, ranks: list[int]) -> tuple[list[str], str]:
    """Input and output subscripts with '...' replaced by letters not in the equation."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise NotMapped(f"Einsum equation '{eq}' has {len(terms)} terms for {len(ranks)} inputs")
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    n_ell = max([r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t] or [0])
    ell = "".join(spare[:n_ell])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", ell[n_ell - (r - len(t.replace("...", ""))) :])
        if len(t) != r:
            raise NotMapped(f"Einsum term '{t}' for an input of rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(out_terms)
        out = ell + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell)
        )
    return out_terms, out


@handles("Einsum")
def _einsum(n: Node) -> list[Value | None]:
    """Each operand's repeated subscripts become a diagonal (multiply by an identity mask and
    sum), then every operand is transposed and unsqueezed onto one order of all subscripts,
    the operands are multiplied (broadcasting) and the subscripts not in the output summed."""
    xs = [n.inp(i) for i in range(len(n.inputs)) if n.has(i)]
    shapes = [_static_shape_of(n, x, "inputs") for x in xs]
    terms, out = _einsum_terms(str(n.attr("equation", "")), [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        for c, d in zip(t, s):
            if d != 1 or c not in sizes:
                sizes[c] = d if sizes.get(c, 1) == 1 else sizes[c]
    order = list(dict.fromkeys(out + "".join(terms)))
    acc: Value | None = None
    for x, t, s in zip(xs, terms, shapes):
        while len(set(t)) < len(t):  # a repeated subscript: take the diagonal
            c = next(c for c in t if t.count(c) > 1)
            i, j = t.index(c), t.index(c, t.index(c) + 1)
            eye_shape = [1] * len(t)
            eye_shape[i], eye_shape[j] = s[i], s[j]
            eye = np.eye(s[i], s[j]).reshape(eye_shape)
            x = n.emit("core.mul", x, n.array(eye, _dtype(x)))
            x = n.emit("core.reduce_sum", x, axes=(j,), keepdims=False)
            t = t[:j] + t[j + 1 :]
            s = s[:j] + s[j + 1 :]
        present = [c for c in order if c in t]
        perm = tuple(t.index(c) for c in present)
        if perm != tuple(range(len(t))):
            x = n.emit("core.transpose", x, perm=perm)
        missing = tuple(k for k, c in enumerate(order) if c not in t)
        if missing:
            x = n.emit("core.unsqueeze", x, axes=missing)
        acc = x if acc is None else n.emit("core.mul", acc, x)
    assert acc is not None
    summed = tuple(k for k, c in enumerate(order) if c not in out)
    if summed:
        acc = n.emit("core.reduce_sum", acc, axes=summed, keepdims=False)
    left = [c for c in order if c in out]
    perm = tuple(left.index(c) for c in out)
    if perm != tuple(range(len(out))):
        acc = n.emit("core.transpose", acc, perm=perm)
    if not out and not summed:
        acc = n.emit("core.reshape", acc, shape=())
    return [acc]


@handles("GatherBlockQuantized", domain=MS)
def _gather_block_quantized(n: Node) -> list[Value | None]:
    """Rows of a block-quantized table (onnxruntime-genai's and llmir's int4/int8 embeddings):
    the packed bytes kept as an nbits weight (the same layout as MatMulNBits' B, whether stored
    [N, K*bits/8] or [N, blocks, block*bits/8]), decoded with llm.dequantize, then looked up."""
    bits, block = int(n.attr("bits", 4)), int(n.attr("block_size", 128))
    if int(n.attr("gather_axis", 0)) != 0:
        raise NotMapped("only gather_axis=0 (rows of the table) is supported")
    dt = n.t(0)
    shape = dt.static_shape()
    if shape is None or dt.dtype != DType.u8 or len(shape) not in (2, 3):
        raise NotMapped("data must be a static uint8 [N, K*bits/8] or [N, blocks, bytes] tensor")
    if int(n.attr("quantize_axis", len(shape) - 1)) != len(shape) - 1:
        raise NotMapped("only blocks along the last axis are supported")
    rows = shape[0]
    row_bytes = 1
    for d in shape[1:]:
        row_bytes *= d
    cols = row_bytes * 8 // bits
    if cols % block:
        raise NotMapped(f"row width {cols} is not a multiple of block_size={block}")
    st = n.t(2)
    if not isinstance(st.dtype, DType) or not st.dtype.is_float:
        raise NotMapped("scales must be a float tensor")
    if n.has(3) and n.t(3).dtype != DType.u8:
        raise NotMapped("zero points must be packed uint8")
    nb = cols // block
    q = QuantType("nbits", bits, block, st.dtype, "int" if n.has(3) else "none")
    w = n.imp.requantized_weight(n.input_names[0], TensorType((rows, cols), q))
    ops = [w, _as_shape(n, 2, (rows, nb))]
    if n.has(3):
        ops.append(_as_shape(n, 3, (rows, (nb * bits + 7) // 8)))
    table = n.emit("llm.dequantize", *ops, dtype=st.dtype)
    y = n.emit("llm.embedding", table, n.inp(1))
    if len(shape) == 3:  # the rows come out as [..., blocks, block]
        y = n.emit("core.reshape", y, shape=(0,) * n.t(1).rank + (nb, block))
    return [y]
