"""Hypothesis strategies: random well-typed modules and attribute values.

`modules()` builds a function with the Builder from a random sequence of elementwise (unary and
broadcasting binary), matmul, reshape, cast and constant ops over arguments with static and
named symbolic dims. Only programs that are well-formed for *every* binding of the symbolic
dims are generated (broadcast partners are equal or 1, reshapes merge, split or insert dims),
so the interpreter can run them with any sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from llmir_core.builder import Builder
from llmir_core.dialects.opdef import OpVerifyError
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Value
from llmir_core.ir.dims import DYN, Dim, SymDim, dim_add, dim_mul, eval_dim
from llmir_core.ir.types import GGUF_QUANTS, DType, TensorType

SYMS = ("batch", "seq", "h")
UNARY = (
    "core.neg",
    "core.abs",
    "core.relu",
    "core.exp",
    "core.tanh",
    "core.sigmoid",
    "core.silu",
    "core.sqrt",
    "core.sin",
    "core.floor",
    "core.erf",
)
BINARY = ("core.add", "core.sub", "core.mul", "core.max", "core.min", "core.div")
FLOATS = (DType.f32, DType.f64, DType.f16)
CAST_TO = (DType.f32, DType.f64, DType.f16, DType.bf16, DType.i32, DType.i64)

dims = st.one_of(st.integers(1, 4), st.sampled_from(SYMS).map(SymDim.name))
shapes = st.lists(dims, min_size=0, max_size=3).map(tuple)


def _text(max_size: int = 10) -> st.SearchStrategy[str]:
    """Any text a file can hold (no lone surrogates)."""
    return st.text(st.characters(exclude_categories=("Cs",)), max_size=max_size)


origins = st.one_of(
    st.none(), st.sampled_from(["hf:model.layers.0.mlp", "onnx:/MatMul_3"]), _text(12)
)


@st.composite
def sym_dims(draw: st.DrawFn) -> Dim:
    """A dim attribute value: an int, `?`, or a small polynomial (maybe with negative terms)."""
    a, b = SymDim.name(draw(st.sampled_from(SYMS))), SymDim.name(draw(st.sampled_from(SYMS)))
    coef, const = draw(st.integers(-3, 3)), draw(st.integers(-5, 5))
    out = dim_mul(coef, a)
    if draw(st.booleans()):
        out = dim_mul(out, b)
    return draw(st.sampled_from([dim_add(out, const), DYN, const, a]))


def attr_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Every kind of attribute value the printer and parser support."""
    leaves = st.one_of(
        st.booleans(),
        st.integers(-(10**20), 10**20),
        st.floats(allow_nan=True, allow_infinity=True),
        _text(),
        st.none(),
        st.sampled_from(list(DType)),
        sym_dims(),
        st.sampled_from(list(GGUF_QUANTS.values())),
        st.builds(lambda s, d: TensorType(s, d), shapes, st.sampled_from(list(DType))),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(_text(6).filter(bool), inner, max_size=3),
        ),
        max_leaves=max_leaves,
    )


def _constant(draw: st.DrawFn, shape: tuple[int, ...], dtype: DType) -> DenseAttr:
    size = int(np.prod(shape)) if shape else 1
    if dtype.is_float:
        vals = draw(st.lists(st.floats(-4, 4, width=16), min_size=size, max_size=size))
    else:
        vals = draw(st.lists(st.integers(-100, 100), min_size=size, max_size=size))
    arr = np.array(vals, dtype=np.float64 if dtype.is_float else np.int64).reshape(shape)
    return DenseAttr(arr.astype(dtype.to_numpy()), TensorType(shape, dtype))


def _broadcast_partner_shape(draw: st.DrawFn, shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """A suffix of `shape` with some dims replaced by 1: broadcasts with it for any binding."""
    k = draw(st.integers(0, len(shape)))
    suffix = shape[len(shape) - k :]
    return tuple(1 if draw(st.booleans()) else d for d in suffix)


def _reshape_target(draw: st.DrawFn, shape: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """A target valid for every binding: merge two adjacent dims, insert a 1, or drop a 1."""
    choice = draw(st.sampled_from(["merge", "insert", "drop", "minus1"]))
    if choice in ("merge", "minus1") and len(shape) >= 2:
        i = draw(st.integers(0, len(shape) - 2))
        merged = dim_mul(shape[i], shape[i + 1])
        target = list(shape[:i]) + [merged] + list(shape[i + 2 :])
        if choice == "minus1":
            target[i] = -1
        return tuple(target)
    if choice == "insert":
        i = draw(st.integers(0, len(shape)))
        return tuple(shape[:i]) + (1,) + tuple(shape[i:])
    ones = [i for i, d in enumerate(shape) if d == 1]
    if choice == "drop" and ones:
        i = draw(st.sampled_from(ones))
        return tuple(shape[:i]) + tuple(shape[i + 1 :])
    return None


@st.composite
def modules(draw: st.DrawFn, max_ops: int = 8) -> Module:
    fn = Function("main", [])
    b = Builder(fn)
    values: list[Value] = []
    for i in range(draw(st.integers(1, 3))):
        values.append(b.arg(f"x{i}", TensorType(draw(shapes), draw(st.sampled_from(FLOATS)))))
    for _ in range(draw(st.integers(3, max_ops))):
        x = draw(st.sampled_from(values))
        t = x.type
        assert isinstance(t, TensorType) and isinstance(t.dtype, DType)
        kind = draw(st.sampled_from(["unary", "binary", "matmul", "reshape", "cast", "constant"]))
        b.origin = draw(origins)
        try:
            if kind == "unary":
                v = b.op(draw(st.sampled_from(UNARY)), x)
            elif kind == "binary":
                same = [y for y in values if y.type == t]
                if draw(st.booleans()):
                    y = draw(st.sampled_from(same))
                else:
                    shape = _broadcast_partner_shape(draw, t.shape)
                    y = b.arg(f"p{len(fn.args)}", TensorType(shape, t.dtype))
                a, c = (x, y) if draw(st.booleans()) else (y, x)
                v = b.op(draw(st.sampled_from(BINARY)), a, c)
            elif kind == "matmul":
                if t.rank == 0:
                    continue
                ta = t.rank >= 2 and draw(st.booleans())
                tb = draw(st.booleans())
                k = t.shape[-2] if ta else t.shape[-1]
                n = draw(dims)
                w = b.arg(f"w{len(fn.args)}", TensorType((n, k) if tb else (k, n), t.dtype))
                v = b.op("core.matmul", x, w, transpose_a=ta, transpose_b=tb)
            elif kind == "reshape":
                target = _reshape_target(draw, t.shape)
                if target is None:
                    continue
                v = b.op("core.reshape", x, shape=target)
            elif kind == "cast":
                v = b.op("core.cast", x, to=draw(st.sampled_from(CAST_TO)))
                if v.type.dtype not in FLOATS:  # keep the pool float: cast back
                    v = b.op("core.cast", v, to=t.dtype)
            else:
                shape = tuple(draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 2))))
                dtype = draw(st.sampled_from(FLOATS))
                v = b.op("core.constant", value=_constant(draw, shape, dtype))
        except OpVerifyError:  # the draw produced an ill-typed combination: skip it
            continue
        values.append(v)
    outs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3, unique_by=id))
    b.ret(*outs)
    fn.attrs = draw(st.dictionaries(_text(6).filter(bool), attr_values(), max_size=2))
    m = Module(
        draw(st.sampled_from(["m", "SmolLM2-135M", "a b"])), [fn], {"llmir.dialects": ("core",)}
    )
    return m


def random_inputs(
    fn: Function, env: dict[str, int], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    out = {}
    for a in fn.args:
        t = a.type
        assert isinstance(t, TensorType) and isinstance(t.dtype, DType)
        shape = tuple(eval_dim(d, env) for d in t.shape)
        assert all(s is not None for s in shape)
        out[a.name] = rng.standard_normal(shape).astype(t.dtype.to_numpy())
    return out


__all__ = ["modules", "attr_values", "random_inputs", "SYMS"]
