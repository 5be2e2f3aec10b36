"""The `core` dialect, part 2: layout, indexing and shape ops.

Each op means what the ONNX operator of the same job means (Transpose, Concat, Split, Slice, Gather,
GatherElements, ScatterElements, ScatterND, Expand, Squeeze, Unsqueeze, Range, Shape, Size, Trilu,
CumSum, ArgMax, ArgMin, TopK, Identity, Tile, Pad, Flatten, Reshape, ConstantOfShape), so an ONNX
frontend maps one node to one op. What ONNX passes as constant inputs (axes, starts, pads, k) are
attributes here; the `*_dyn` forms and `constant_of_shape` take them as run-time i64 tensors.

Shape rules keep named dims flowing where the result is exact for every value of the names
(including 0): transpose permutes them, concat adds them, a full slice keeps them. A size that
depends on run-time data or on clamping against an unknown size is `?`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from llmir_core.ir.dims import (
    DYN,
    Dim,
    SymDim,
    dim_add,
    dim_div_exact,
    dim_mul,
    eval_dim,
    format_dim,
)
from llmir_core.ir.types import DType, TensorType, Type, numpy_dtype

from . import ranges
from .core import _ref_reshape
from .opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError, encoding
from .registry import register
from .shapes import (
    broadcast_shapes,
    dims_of,
    fmt_shape,
    is_type,
    like,
    norm_axes,
    norm_axis,
    prod_dims,
    same_dtype,
    tensor_arg,
)

_X = (Operand("x"),)
_INDEX_DTYPES = (DType.i64, DType.i32)
# slice bounds at or beyond this magnitude mean "to the end" / "from the start": exporters write
# INT64_MAX or INT32_MAX there, and no tensor dim reaches 2**31 - 1
_HUGE = 2**31 - 1


# -- helpers ------------------------------------------------------------------------------


def is_float_array(a: np.ndarray) -> bool:
    """True for numpy floats and the ml_dtypes floats (bf16, f8), whose numpy kind is 'V'."""
    return a.dtype.kind == "f" or (a.dtype.kind == "V" and "float" in a.dtype.name)


def numeric_tensor(ctx: InferCtx, i: int, what: str, allow_bool: bool = False) -> TensorType:
    t = tensor_arg(ctx, i, what)
    if not isinstance(t.dtype, DType):
        raise OpVerifyError(f"{what} is quantized ({t.dtype}); insert llm.dequantize first")
    if t.dtype == DType.bool and not allow_bool:
        raise OpVerifyError(f"{what} must be numeric, got bool")
    return t


def _index_tensor(ctx: InferCtx, i: int, what: str) -> TensorType:
    t = tensor_arg(ctx, i, what)
    if t.dtype not in _INDEX_DTYPES:
        raise OpVerifyError(f"{what} must be i64 or i32, got {t.dtype}")
    return t


def _shape_operand(ctx: InferCtx, i: int, what: str, dtypes: Sequence[DType] = (DType.i64,)) -> int:
    """A 1-D integer operand whose static length fixes a rank or a count; returns that length."""
    t = tensor_arg(ctx, i, what)
    if t.dtype not in dtypes:
        raise OpVerifyError(f"{what} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.rank != 1:
        raise OpVerifyError(f"{what} must be 1-D, got rank {t.rank}")
    n = t.shape[0]
    if not isinstance(n, int):
        raise OpVerifyError(
            f"{what} must have a static length (it fixes the result's rank), got {t}"
        )
    return n


def _merge_dim(a: Dim, b: Dim, what: str) -> Dim:
    """Two dims that must be equal: the better known of the two, or an error if they differ."""
    if a is DYN:
        return b
    if b is DYN:
        return a
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise OpVerifyError(f"{what}: {a} != {b}")
    if isinstance(a, SymDim) and isinstance(b, SymDim) and a != b:
        raise OpVerifyError(f"{what}: {format_dim(a)} != {format_dim(b)} (differ symbolically)")
    return a if isinstance(a, int) else b


def _eval_dims(dims: Sequence[Dim], env: dict[str, int], what: str) -> list[int]:
    out = []
    for d in dims:
        v = eval_dim(d, env)
        if v is None:
            raise ValueError(f"{what} dim {format_dim(d)} is not bound at run time")
        out.append(v)
    return out


def _ints(a: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


# -- transpose, concat, split ---------------------------------------------------------------


def _perm(perm: Sequence[int], rank: int) -> list[int]:
    p = list(perm) if perm else list(range(rank))[::-1]
    if sorted(p) != list(range(rank)):
        raise OpVerifyError(f"perm {list(perm)} is not a permutation of the {rank} axes of x")
    return p


def _infer_transpose(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    return [like(x, [x.shape[p] for p in _perm(ctx["perm"], x.rank)])]


register(
    OpDef(
        name="core.transpose",
        summary="Permute the axes: result axis i is x's axis perm[i] (empty perm reverses).",
        operands=_X,
        attrs=(Attr("perm", "ints", (), doc="a permutation of 0..rank-1; empty = reversed"),),
        infer=_infer_transpose,
        reference=lambda a, at: np.ascontiguousarray(
            np.transpose(a[0], _perm(at["perm"], a[0].ndim))
        ),
        smt=encoding("core_smt", "transpose"),
        interval=ranges.iv_first,
        cost=ranges.cost_free,
        verifies="perm is a permutation of x's axes.",
        example="%y = core.transpose %x {perm = [0, 2, 1, 3]} : (tensor<?batch x ?seq x 9 x 64 x f32>) "
        "-> tensor<?batch x 9 x ?seq x 64 x f32>",
    )
)


def _infer_concat(ctx: InferCtx) -> list[Type]:
    if not ctx.types:
        raise OpVerifyError("concat needs at least one input")
    ts = [tensor_arg(ctx, i, f"input #{i}") for i in range(len(ctx.types))]
    same_dtype(ctx)
    rank = ts[0].rank
    if rank == 0:
        raise OpVerifyError("concat inputs must have rank >= 1")
    for i, t in enumerate(ts):
        if t.rank != rank:
            raise OpVerifyError(f"input #{i} has rank {t.rank}, input #0 has rank {rank}")
    axis = norm_axis(ctx["axis"], rank)
    out = list(ts[0].shape)
    total: Dim = 0
    for i, t in enumerate(ts):
        total = dim_add(total, t.shape[axis])
        for j, d in enumerate(t.shape):
            if j != axis:
                out[j] = _merge_dim(out[j], d, f"input #{i} dim {j} differs from the other inputs")
    out[axis] = total
    return [like(ts[0], out)]


register(
    OpDef(
        name="core.concat",
        summary="Join tensors along `axis`; all other dims must agree.",
        operands=(Operand("inputs", variadic=True),),
        attrs=(Attr("axis", "int"),),
        infer=_infer_concat,
        reference=lambda a, at: np.concatenate(a, axis=at["axis"]),
        smt=encoding("core_smt", "concat"),
        interval=ranges.iv_union,
        verifies="there is at least one input, all inputs share dtype and rank, axis is in range and the "
        "other dims agree.",
        example="%y = core.concat %past, %new {axis = 2} : (tensor<?b x 3 x ?past x 64 x f16>, "
        "tensor<?b x 3 x ?seq x 64 x f16>) -> tensor<?b x 3 x ?past+?seq x 64 x f16>",
    )
)


def _split_sizes(ctx: InferCtx, d: Dim) -> list[Dim]:
    sizes = list(dims_of(ctx["sizes"]))
    n = ctx["num_outputs"]
    if sizes:
        if n and n != len(sizes):
            raise OpVerifyError(f"num_outputs = {n} but sizes lists {len(sizes)} parts")
        for s in sizes:
            if s is DYN or (isinstance(s, int) and s < 0):
                raise OpVerifyError(f"split size {format_dim(s)} is not a size")
        total: Dim = 0
        for s in sizes:
            total = dim_add(total, s)
        if d is not DYN and (isinstance(d, int) == isinstance(total, int)) and total != d:
            raise OpVerifyError(
                f"sizes sum to {format_dim(total)}, but the split axis has {format_dim(d)}"
            )
        return sizes
    if n < 1:
        raise OpVerifyError("give sizes, or num_outputs >= 1 for equal parts")
    if not isinstance(d, int):
        return [dim_div_exact(d, n)] * n
    chunk = -(-d // n)
    last = d - chunk * (n - 1)
    if last < 0:
        raise OpVerifyError(f"cannot split {d} into {n} parts of ceil({d}/{n}) = {chunk}")
    return [chunk] * (n - 1) + [last]


def _infer_split(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    axis = norm_axis(ctx["axis"], x.rank)
    if x.rank == 0:
        raise OpVerifyError("cannot split a scalar")
    out: list[Type] = []
    for s in _split_sizes(ctx, x.shape[axis]):
        shape = list(x.shape)
        shape[axis] = s
        out.append(like(x, shape))
    return out


def _ref_split(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = args[0]
    axis = attrs["axis"] % x.ndim
    d = x.shape[axis]
    if attrs["sizes"]:
        sizes = _eval_dims(attrs["sizes"], attrs["__env__"], "split size")
        if sum(sizes) != d:
            raise ValueError(f"split sizes {sizes} do not sum to {d}")
    else:
        n = attrs["num_outputs"]
        chunk = -(-d // n)
        sizes = [chunk] * (n - 1) + [d - chunk * (n - 1)]
        if sizes[-1] < 0:
            raise ValueError(f"cannot split {d} into {n} parts")
    offsets = np.cumsum([0] + sizes)
    return [np.take(x, np.arange(offsets[i], offsets[i + 1]), axis=axis) for i in range(len(sizes))]


register(
    OpDef(
        name="core.split",
        summary="Cut x along `axis` into parts of the given sizes, or into num_outputs parts of "
        "ceil(dim / num_outputs) (the last one smaller).",
        operands=_X,
        attrs=(
            Attr("axis", "int", 0),
            Attr("sizes", "dims", (), doc="part sizes; empty = equal parts"),
            Attr("num_outputs", "int", 0, doc="number of equal parts when sizes is empty"),
        ),
        infer=_infer_split,
        reference=_ref_split,
        variadic_results=True,
        results=("outputs",),
        smt=encoding("core_smt", "split"),
        interval=ranges.iv_first,
        verifies="axis is in range and the sizes sum to the split dim (or num_outputs parts fit it).",
        example="%q, %k, %v = core.split %qkv {axis = 2, sizes = [576, 192, 192]} : "
        "(tensor<?b x ?s x 960 x f32>) -> (tensor<?b x ?s x 576 x f32>, tensor<?b x ?s x 192 x f32>, "
        "tensor<?b x ?s x 192 x f32>)",
    )
)


# -- slice ----------------------------------------------------------------------------------


def _slice_bounds(d: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice clamping for one axis of size d: (start, end, count); end -1 means 'past 0'."""
    if start < 0:
        start += d
    if end < 0:
        end += d
    if step > 0:
        start, end = min(max(start, 0), d), min(max(end, 0), d)
    else:
        start, end = min(max(start, 0), d - 1), min(max(end, -1), d - 1)
    return start, end, max(0, -((start - end) // step))


def _slice_sym(d: Dim, start: int, end: int, step: int) -> Dim:
    """The slice size on a dim of unknown value, when it is the same for every d >= 0."""
    if step == 1 and (start == 0 or start <= -_HUGE) and end >= _HUGE:
        return d
    if step == -1 and (start == -1 or start >= _HUGE) and end <= -_HUGE:
        return d
    same_side = (start >= 0) == (end >= 0) and abs(start) < _HUGE and abs(end) < _HUGE
    if same_side and (end <= start if step > 0 else end >= start):
        return 0
    return DYN


def _slice_params(
    starts: Sequence[int], ends: Sequence[int], axes: Sequence[int], steps: Sequence[int], rank: int
) -> list[tuple[int, int, int, int]]:
    n = len(starts)
    if len(ends) != n:
        raise OpVerifyError(f"starts has {n} entries but ends has {len(ends)}")
    axes = list(axes) if len(axes) else list(range(n))
    steps = list(steps) if len(steps) else [1] * n
    if len(axes) != n or len(steps) != n:
        raise OpVerifyError(
            f"starts, ends, axes and steps need the same length; got {n}, {len(ends)}, "
            f"{len(axes)}, {len(steps)}"
        )
    axes = norm_axes(axes, rank)
    if 0 in steps:
        raise OpVerifyError("slice steps must be nonzero")
    return list(zip(axes, starts, ends, steps))


def _infer_slice(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    out = list(x.shape)
    for axis, s, e, step in _slice_params(
        ctx["starts"], ctx["ends"], ctx["axes"], ctx["steps"], x.rank
    ):
        d = x.shape[axis]
        out[axis] = (
            _slice_bounds(d, s, e, step)[2] if isinstance(d, int) else _slice_sym(d, s, e, step)
        )
    return [like(x, out)]


def _do_slice(x: np.ndarray, params: list[tuple[int, int, int, int]]) -> np.ndarray:
    index = [slice(None)] * x.ndim
    for axis, s, e, step in params:
        start, end, _ = _slice_bounds(x.shape[axis], s, e, step)
        index[axis] = slice(start, end if end >= 0 else None, step)
    return np.array(x[tuple(index)])


def _ref_slice(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    return _do_slice(
        x, _slice_params(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"], x.ndim)
    )


register(
    OpDef(
        name="core.slice",
        summary="Take x[start:end:step] on the given axes with ONNX clamping (negative bounds count from "
        "the end; bounds past the dim clamp to it).",
        operands=_X,
        attrs=(
            Attr("starts", "ints"),
            Attr("ends", "ints"),
            Attr("axes", "ints", (), doc="the axes sliced; empty = 0..len(starts)-1"),
            Attr("steps", "ints", (), doc="nonzero steps; empty = all 1"),
        ),
        infer=_infer_slice,
        reference=_ref_slice,
        smt=encoding("core_smt", "slice"),
        interval=ranges.iv_first,
        verifies="starts, ends, axes and steps have one length, axes are distinct and in range, steps nonzero.",
        example="%y = core.slice %x {starts = [-1], ends = [9223372036854775807], axes = [1]} : "
        "(tensor<?b x ?s x 64 x f32>) -> tensor<?b x 1 x 64 x f32>",
    )
)


def _infer_slice_dyn(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    n = _shape_operand(ctx, 1, "starts", _INDEX_DTYPES)
    for i, what in enumerate(("ends", "axes", "steps")[: len(ctx.types) - 2]):
        m = _shape_operand(ctx, 2 + i, what, _INDEX_DTYPES)
        if m != n:
            raise OpVerifyError(f"{what} has {m} entries but starts has {n}")
    if len(ctx.types) > 3:  # run-time axes: any axis may be sliced
        return [like(x, [DYN] * x.rank)]
    if n > x.rank:
        raise OpVerifyError(f"starts has {n} entries but x has rank {x.rank}")
    return [like(x, [DYN] * n + list(x.shape[n:]))]


def _ref_slice_dyn(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    lists = [_ints(a) for a in args[1:]] + [[], []]
    try:
        params = _slice_params(lists[0], lists[1], lists[2], lists[3], x.ndim)
    except OpVerifyError as exc:
        raise ValueError(str(exc)) from None
    return _do_slice(x, params)


register(
    OpDef(
        name="core.slice_dyn",
        summary="core.slice with starts, ends, axes and steps given as run-time 1-D integer tensors.",
        operands=(
            Operand("x"),
            Operand("starts"),
            Operand("ends"),
            Operand("axes", optional=True),
            Operand("steps", optional=True),
        ),
        attrs=(),
        infer=_infer_slice_dyn,
        reference=_ref_slice_dyn,
        no_smt="its result shape is an operand's values, not known from types and attributes",
        interval=ranges.iv_first,
        verifies="starts, ends, axes and steps are 1-D integer tensors of one static length.",
        example="%y = core.slice_dyn %x, %s, %e : (tensor<?n x 64 x f32>, tensor<1xi64>, tensor<1xi64>) "
        "-> tensor<?x64xf32>",
    )
)


# -- gather and scatter ---------------------------------------------------------------------


def _infer_gather(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    idx = _index_tensor(ctx, 1, "indices")
    if x.rank == 0:
        raise OpVerifyError("cannot gather from a scalar")
    axis = norm_axis(ctx["axis"], x.rank)
    return [like(x, x.shape[:axis] + idx.shape + x.shape[axis + 1 :])]


register(
    OpDef(
        name="core.gather",
        summary="Pick slices of x along `axis` by index (negative indices count from the end): "
        "result shape is x.shape[:axis] + indices.shape + x.shape[axis+1:].",
        operands=(Operand("x"), Operand("indices")),
        attrs=(Attr("axis", "int", 0),),
        infer=_infer_gather,
        reference=lambda a, at: np.take(a[0], a[1], axis=at["axis"]),
        smt=encoding("core_smt", "gather"),
        interval=ranges.iv_first,
        verifies="indices are i64 or i32 and axis is in range for x.",
        example="%y = core.gather %table, %ids {axis = 0} : (tensor<49152x576xf32>, tensor<?b x ?s x i64>) "
        "-> tensor<?b x ?s x 576 x f32>",
    )
)


def _check_indices(idx: np.ndarray, n: int) -> np.ndarray:
    idx = idx.astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise IndexError(
            f"index {int(idx[bad].reshape(-1)[0])} is out of range for a dim of size {n}"
        )
    return np.where(idx < 0, idx + n, idx)


def _same_rank(ctx: InferCtx, names: Sequence[str]) -> list[TensorType]:
    ts = [tensor_arg(ctx, i, w) for i, w in enumerate(names)]
    for w, t in zip(names[1:], ts[1:]):
        if t.rank != ts[0].rank:
            raise OpVerifyError(f"{w} has rank {t.rank}, x has rank {ts[0].rank}")
    return ts


def _infer_gather_elements(ctx: InferCtx) -> list[Type]:
    x, idx = _same_rank(ctx, ("x", "indices"))
    _index_tensor(ctx, 1, "indices")
    if x.rank == 0:
        raise OpVerifyError("cannot gather from a scalar")
    axis = norm_axis(ctx["axis"], x.rank)
    for j, (a, b) in enumerate(zip(x.shape, idx.shape)):
        if j != axis and isinstance(a, int) and isinstance(b, int) and b > a:
            raise OpVerifyError(f"indices dim {j} is {b}, larger than x's {a}")
    return [like(x, idx.shape)]


def _ref_gather_elements(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, idx = args
    axis = attrs["axis"] % x.ndim
    idx = _check_indices(idx, x.shape[axis])
    crop = tuple(slice(None) if j == axis else slice(0, n) for j, n in enumerate(idx.shape))
    return np.take_along_axis(x[crop], idx, axis=axis)


register(
    OpDef(
        name="core.gather_elements",
        summary="Elementwise gather along `axis`: y[i][j][k] = x[indices[i][j][k]][j][k] for axis 0; the "
        "result has the indices' shape.",
        operands=(Operand("x"), Operand("indices")),
        attrs=(Attr("axis", "int", 0),),
        infer=_infer_gather_elements,
        reference=_ref_gather_elements,
        smt=encoding("core_smt", "gather_elements"),
        interval=ranges.iv_first,
        verifies="x and indices have one rank, indices are i64 or i32, and indices' other dims fit in x's.",
        example="%y = core.gather_elements %x, %i {axis = 1} : (tensor<4x8xf32>, tensor<4x2xi64>) -> tensor<4x2xf32>",
    )
)

_REDUCTIONS = ("none", "add", "mul", "max", "min")
_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(
    out: np.ndarray, key: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str
) -> np.ndarray:
    if reduction == "none":
        out[key] = updates
    else:
        _UFUNC[reduction].at(out, key, updates)
    return out


def _infer_scatter_elements(ctx: InferCtx) -> list[Type]:
    x, idx, upd = _same_rank(ctx, ("x", "indices", "updates"))
    _index_tensor(ctx, 1, "indices")
    same_dtype(ctx, [0, 2])
    if x.rank == 0:
        raise OpVerifyError("cannot scatter into a scalar")
    norm_axis(ctx["axis"], x.rank)
    for j, (a, b) in enumerate(zip(idx.shape, upd.shape)):
        _merge_dim(a, b, f"indices and updates differ in dim {j}")
    return [x]


def _ref_scatter_elements(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, idx, upd = args
    axis = attrs["axis"] % x.ndim
    if idx.shape != upd.shape:
        raise ValueError(f"indices {list(idx.shape)} and updates {list(upd.shape)} differ in shape")
    key: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    key[axis] = _check_indices(idx, x.shape[axis])
    return _scatter(x.copy(), tuple(key), upd, attrs["reduction"])


register(
    OpDef(
        name="core.scatter_elements",
        summary="A copy of x with updates written (or combined by `reduction`) at the positions that "
        "indices name along `axis`.",
        operands=(Operand("x"), Operand("indices"), Operand("updates")),
        attrs=(Attr("axis", "int", 0), Attr("reduction", "str", "none", choices=_REDUCTIONS)),
        infer=_infer_scatter_elements,
        reference=_ref_scatter_elements,
        no_smt="a write at data-dependent positions: an element's value depends on which "
        "update (if any) targets it, an existential over the updates",
        verifies="x, indices and updates share a rank, indices and updates a shape, x and updates a dtype.",
        example='%y = core.scatter_elements %x, %i, %u {axis = 1, reduction = "add"} : '
        "(tensor<4x8xf32>, tensor<4x2xi64>, tensor<4x2xf32>) -> tensor<4x8xf32>",
    )
)


def _infer_scatter_nd(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    idx = _index_tensor(ctx, 1, "indices")
    upd = tensor_arg(ctx, 2, "updates")
    same_dtype(ctx, [0, 2])
    if idx.rank == 0:
        raise OpVerifyError("indices must have rank >= 1")
    k = idx.shape[-1]
    if not isinstance(k, int):
        return [x]
    if not 1 <= k <= x.rank:
        raise OpVerifyError(f"indices' last dim {k} must be in 1..{x.rank} (x's rank)")
    want = list(idx.shape[:-1]) + list(x.shape[k:])
    if upd.rank != len(want):
        raise OpVerifyError(
            f"updates must have shape {fmt_shape(want)}, got {fmt_shape(upd.shape)}"
        )
    for j, (a, b) in enumerate(zip(want, upd.shape)):
        _merge_dim(a, b, f"updates dim {j} should be {format_dim(a)}")
    return [x]


def _ref_scatter_nd(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, idx, upd = args
    k = idx.shape[-1]
    flat = idx.reshape(-1, k).astype(np.int64)
    key = tuple(_check_indices(flat[:, j], x.shape[j]) for j in range(k))
    return _scatter(x.copy(), key, upd.reshape((flat.shape[0],) + x.shape[k:]), attrs["reduction"])


register(
    OpDef(
        name="core.scatter_nd",
        summary="A copy of x with slices updates[i...] written (or combined by `reduction`) at x[indices[i...]].",
        operands=(Operand("x"), Operand("indices"), Operand("updates")),
        attrs=(Attr("reduction", "str", "none", choices=_REDUCTIONS),),
        infer=_infer_scatter_nd,
        reference=_ref_scatter_nd,
        no_smt="a write at data-dependent positions: an element's value depends on which "
        "update (if any) targets it, an existential over the updates",
        verifies="indices' last dim k is at most x's rank and updates has shape indices.shape[:-1] + x.shape[k:].",
        example="%y = core.scatter_nd %x, %i, %u : (tensor<8x4xf32>, tensor<2x1xi64>, tensor<2x4xf32>) "
        "-> tensor<8x4xf32>",
    )
)


# -- expand, squeeze, unsqueeze, tile, pad, flatten -----------------------------------------


def _infer_expand(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    shape = dims_of(ctx["shape"])
    for d in shape:
        if d is DYN or (isinstance(d, int) and d < 0):
            raise OpVerifyError(
                f"shape dim {format_dim(d)} is not a size (use core.expand_dyn for run-time shapes)"
            )
    return [like(x, broadcast_shapes(x.shape, shape))]


def _broadcast_to(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    return np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape))))


register(
    OpDef(
        name="core.expand",
        summary="Broadcast x against `shape` (numpy rules in both directions: a 1 in shape keeps x's dim).",
        operands=_X,
        attrs=(Attr("shape", "dims", doc="sizes, static or symbolic"),),
        infer=_infer_expand,
        reference=lambda a, at: _broadcast_to(
            a[0], _eval_dims(at["shape"], at["__env__"], "expand shape")
        ),
        smt=encoding("core_smt", "expand"),
        interval=ranges.iv_first,
        verifies="shape holds sizes and broadcasts with x's shape.",
        example="%y = core.expand %m {shape = [?b, 1, ?s, ?s]} : (tensor<1 x 1 x ?s x ?s x bool>) "
        "-> tensor<?b x 1 x ?s x ?s x bool>",
    )
)


def _infer_expand_dyn(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    n = _shape_operand(ctx, 1, "shape")
    rank = max(n, x.rank)
    xs: list[Dim | None] = [None] * (rank - x.rank) + list(x.shape)
    # only a static dim other than 1 survives an unknown broadcast partner
    return [like(x, [d if isinstance(d, int) and d != 1 else DYN for d in xs])]


register(
    OpDef(
        name="core.expand_dyn",
        summary="core.expand with the shape given as a run-time 1-D i64 tensor.",
        operands=(Operand("x"), Operand("shape")),
        attrs=(),
        infer=_infer_expand_dyn,
        reference=lambda a, at: _broadcast_to(a[0], _ints(a[1])),
        no_smt="its result shape is an operand's values, not known from types and attributes",
        interval=ranges.iv_first,
        verifies="shape is a 1-D i64 tensor of static length.",
        example="%y = core.expand_dyn %x, %s : (tensor<1x64xf32>, tensor<3xi64>) -> tensor<?x?x64xf32>",
    )
)


def _squeeze_axes(axes: Sequence[int], shape: Sequence[Dim]) -> list[int]:
    if not axes:
        if any(not isinstance(d, int) for d in shape):
            raise OpVerifyError(
                f"squeeze without axes needs a static shape, got {fmt_shape(shape)}; give axes"
            )
        return [i for i, d in enumerate(shape) if d == 1]
    ax = norm_axes(axes, len(shape))
    for a in ax:
        d = shape[a]
        if isinstance(d, int) and d != 1:
            raise OpVerifyError(f"cannot squeeze axis {a} of size {d}")
    return ax


def _infer_squeeze(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    ax = _squeeze_axes(ctx["axes"], x.shape)
    return [like(x, [d for i, d in enumerate(x.shape) if i not in ax])]


def _ref_squeeze(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    axes = tuple(a % x.ndim for a in attrs["axes"]) if attrs["axes"] else None
    return np.array(np.squeeze(x, axis=axes))


register(
    OpDef(
        name="core.squeeze",
        summary="Drop the given size-1 axes (empty axes: every size-1 axis).",
        operands=_X,
        attrs=(Attr("axes", "ints", (), doc="axes of size 1; empty = all of them"),),
        infer=_infer_squeeze,
        reference=_ref_squeeze,
        smt=encoding("core_smt", "squeeze"),
        interval=ranges.iv_first,
        verifies="axes are distinct, in range and not of a static size other than 1.",
        example="%y = core.squeeze %x {axes = [1]} : (tensor<?b x 1 x 64 x f32>) -> tensor<?b x 64 x f32>",
    )
)


def _infer_unsqueeze(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    rank = x.rank + len(ctx["axes"])
    ax = set(norm_axes(ctx["axes"], rank))
    it = iter(x.shape)
    return [like(x, [1 if i in ax else next(it) for i in range(rank)])]


register(
    OpDef(
        name="core.unsqueeze",
        summary="Insert size-1 axes at the given positions of the result.",
        operands=_X,
        attrs=(Attr("axes", "ints", doc="positions in the result, negative from the end"),),
        infer=_infer_unsqueeze,
        reference=lambda a, at: np.expand_dims(
            a[0], tuple(norm_axes(at["axes"], a[0].ndim + len(at["axes"])))
        ),
        smt=encoding("core_smt", "unsqueeze"),
        interval=ranges.iv_first,
        verifies="axes are distinct and in range for the result's rank.",
        example="%y = core.unsqueeze %x {axes = [1, 2]} : (tensor<?b x ?s x i64>) -> tensor<?b x 1 x 1 x ?s x i64>",
    )
)


def _infer_tile(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    reps = ctx["repeats"]
    if len(reps) != x.rank:
        raise OpVerifyError(f"repeats has {len(reps)} entries, x has rank {x.rank}")
    if any(r < 0 for r in reps):
        raise OpVerifyError(f"repeats {list(reps)} must be >= 0")
    return [like(x, [dim_mul(d, r) for d, r in zip(x.shape, reps)])]


register(
    OpDef(
        name="core.tile",
        summary="Repeat x `repeats[i]` times along each axis i.",
        operands=_X,
        attrs=(Attr("repeats", "ints", doc="one count per axis"),),
        infer=_infer_tile,
        reference=lambda a, at: np.tile(a[0], at["repeats"]),
        smt=encoding("core_smt", "tile"),
        interval=ranges.iv_first,
        verifies="repeats has one non-negative entry per axis of x.",
        example="%y = core.tile %x {repeats = [1, 3]} : (tensor<?n x 4 x f32>) -> tensor<?n x 12 x f32>",
    )
)

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _infer_pad(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    pads = ctx["pads"]
    if len(pads) != 2 * x.rank:
        raise OpVerifyError(f"pads has {len(pads)} entries, expected 2 * rank = {2 * x.rank}")
    out = []
    for i, d in enumerate(x.shape):
        begin, end = pads[i], pads[i + x.rank]
        n = dim_add(dim_add(d, begin), end)
        if isinstance(n, int) and n < 0:
            raise OpVerifyError(f"pads [{begin}, {end}] on axis {i} of size {d} leave {n} elements")
        if ctx["mode"] == "reflect" and isinstance(d, int) and max(begin, end) > d - 1:
            raise OpVerifyError(
                f"reflect pads [{begin}, {end}] on axis {i} need a size > {max(begin, end)}, got {d}"
            )
        out.append(n)
    return [like(x, out)]


def _ref_pad(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    r = x.ndim
    pads, mode = attrs["pads"], attrs["mode"]
    # negative pads crop first (as onnxruntime does), then the positive ones pad
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + r], 0)) for i in range(r))
    x = x[crop]
    width = [(max(pads[i], 0), max(pads[i + r], 0)) for i in range(r)]
    if mode == "reflect" and any(max(w) > d - 1 for w, d in zip(width, x.shape)):
        raise ValueError(
            f"reflect pads {pads} need every padded axis longer than its pads ({list(x.shape)})"
        )
    if mode == "constant":
        value = np.array(attrs["value"]).astype(x.dtype)
        return np.pad(x, width, mode="constant", constant_values=value)
    return np.pad(x, width, mode=mode)


register(
    OpDef(
        name="core.pad",
        summary="Pad x by pads = [begin_0, ..., begin_n-1, end_0, ..., end_n-1] (negative pads crop) "
        "with a constant, a reflection, the edge value or wrap-around.",
        operands=_X,
        attrs=(
            Attr("pads", "ints", doc="ONNX layout: all begins, then all ends"),
            Attr("mode", "str", "constant", choices=_PAD_MODES),
            Attr("value", "float", 0.0, doc="fill value for mode constant, cast to x's dtype"),
        ),
        infer=_infer_pad,
        reference=_ref_pad,
        smt=encoding("core_smt", "pad"),
        interval=ranges.iv_pad,
        verifies="pads has 2 entries per axis and leaves no axis with a negative size.",
        example="%y = core.pad %x {pads = [0, 1, 0, 2]} : (tensor<?n x 4 x f32>) -> tensor<?n x 7 x f32>",
    )
)


def _flatten_axis(axis: int, rank: int) -> int:
    if not -rank <= axis <= rank:
        raise OpVerifyError(
            f"axis {axis} is out of range for flatten of rank {rank} (allowed {-rank}..{rank})"
        )
    return axis + rank if axis < 0 else axis


def _infer_flatten(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    a = _flatten_axis(ctx["axis"], x.rank)
    return [like(x, [prod_dims(x.shape[:a]), prod_dims(x.shape[a:])])]


def _ref_flatten(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    a = attrs["axis"] + x.ndim if attrs["axis"] < 0 else attrs["axis"]
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))


register(
    OpDef(
        name="core.flatten",
        summary="Reshape x to 2-D: [prod(dims before axis), prod(dims from axis on)].",
        operands=_X,
        attrs=(Attr("axis", "int", 1, doc="in -rank..rank"),),
        infer=_infer_flatten,
        reference=_ref_flatten,
        smt=encoding("core_smt", "flatten"),
        interval=ranges.iv_first,
        verifies="axis is in -rank..rank.",
        example="%y = core.flatten %x {axis = 1} : (tensor<?n x 3 x 4 x f32>) -> tensor<?n x 12 x f32>",
    )
)


def _ref_reshape_dyn(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, shape = args
    target = _ints(shape)
    if attrs["allowzero"] and 0 in target and -1 in target:
        raise ValueError("shape has both 0 and -1 while allowzero is set")
    return _ref_reshape([x], {"shape": tuple(target), "allowzero": attrs["allowzero"]})


register(
    OpDef(
        name="core.reshape_dyn",
        summary="core.reshape with the target shape given as a run-time 1-D i64 tensor (0 copies a dim "
        "unless allowzero, -1 is inferred).",
        operands=(Operand("x"), Operand("shape")),
        attrs=(Attr("allowzero", "bool", False),),
        infer=lambda ctx: [like(tensor_arg(ctx, 0, "x"), [DYN] * _shape_operand(ctx, 1, "shape"))],
        reference=_ref_reshape_dyn,
        no_smt="its result shape is an operand's values, not known from types and attributes",
        interval=ranges.iv_first,
        verifies="shape is a 1-D i64 tensor of static length (the result's rank).",
        example="%y = core.reshape_dyn %x, %s : (tensor<?n x 576 x f32>, tensor<3xi64>) -> tensor<?x?x?xf32>",
    )
)


def _infer_constant_of_shape(ctx: InferCtx) -> list[Type]:
    n = _shape_operand(ctx, 0, "shape")
    value = ctx["value"]
    if value is None:
        return [TensorType((DYN,) * n, DType.f32)]
    if value.array.size != 1:
        raise OpVerifyError(f"value must hold one element, got {value.type}")
    return [TensorType((DYN,) * n, value.type.dtype)]


def _ref_constant_of_shape(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    shape = _ints(args[0])
    if any(s < 0 for s in shape):
        raise ValueError(f"shape {shape} has a negative size")
    v = attrs["value"]
    if v is None:
        return np.zeros(shape, np.float32)
    return np.full(shape, v.array.reshape(-1)[0], dtype=numpy_dtype(v.type.dtype))


register(
    OpDef(
        name="core.constant_of_shape",
        summary="A tensor of run-time shape `shape` filled with `value` (default 0.0 f32).",
        operands=(Operand("shape"),),
        attrs=(Attr("value", "dense", None, doc="one element, its type gives the dtype"),),
        infer=_infer_constant_of_shape,
        reference=_ref_constant_of_shape,
        smt=encoding("core_smt", "constant_of_shape"),
        verifies="shape is a 1-D i64 tensor of static length and value holds one element.",
        example="%y = core.constant_of_shape %s {value = dense<1> : tensor<1xi64>} : (tensor<2xi64>) "
        "-> tensor<?x?xi64>",
    )
)


# -- range, shape, size, identity -----------------------------------------------------------


def _infer_range(ctx: InferCtx) -> list[Type]:
    for i, w in enumerate(("start", "limit", "delta")):
        t = numeric_tensor(ctx, i, w)
        if t.rank != 0:
            raise OpVerifyError(f"{w} must be a scalar, got {t}")
    return [TensorType((DYN,), same_dtype(ctx))]


def _ref_range(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    dt = args[0].dtype
    if is_float_array(args[0]):
        start, limit, delta = (float(a) for a in args)
        if delta == 0:
            raise ValueError("range delta is 0")
        n = max(math.ceil((limit - start) / delta), 0)
        return (start + np.arange(n, dtype=np.float64) * delta).astype(dt)
    istart, ilimit, idelta = (int(a) for a in args)
    if idelta == 0:
        raise ValueError("range delta is 0")
    n = max(-((istart - ilimit) // idelta), 0)
    return (istart + np.arange(n, dtype=np.int64) * idelta).astype(dt)


register(
    OpDef(
        name="core.range",
        summary="The 1-D sequence start, start + delta, ... up to (excluding) limit: "
        "max(ceil((limit - start) / delta), 0) elements.",
        operands=(Operand("start"), Operand("limit"), Operand("delta")),
        attrs=(),
        infer=_infer_range,
        reference=_ref_range,
        no_smt="its length is computed from its operands' values",
        verifies="start, limit and delta are numeric scalars of one dtype.",
        example="%p = core.range %a, %b, %c : (tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<?xi64>",
    )
)


def _shape_range(start: int, end: int | None, rank: int) -> tuple[int, int]:
    def clamp(v: int) -> int:
        return min(max(v + rank if v < 0 else v, 0), rank)

    s, e = clamp(start), rank if end is None else clamp(end)
    return s, max(s, e)


def _infer_shape(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    end = ctx["end"]
    if end is not None and (isinstance(end, bool) or not isinstance(end, int)):
        raise OpVerifyError(f"end must be an int or none, got {end!r}")
    s, e = _shape_range(ctx["start"], ctx["end"], x.rank)
    return [TensorType((e - s,), DType.i64)]


def _ref_shape(args: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    shape = tuple(args[0].shape)
    s, e = _shape_range(attrs["start"], attrs["end"], len(shape))
    return np.array(shape[s:e], dtype=np.int64)


register(
    OpDef(
        name="core.shape",
        summary="x's dims start..end (clamped, negative from the end) as a 1-D i64 tensor.",
        operands=_X,
        attrs=(
            Attr("start", "int", 0),
            Attr("end", "any", None, doc="an int, or none for the rank"),
        ),
        infer=_infer_shape,
        reference=_ref_shape,
        smt=encoding("core_smt", "shape"),
        verifies="x is a tensor; the result length is fixed by start, end and x's rank.",
        example="%s = core.shape %x {start = 1} : (tensor<?b x ?s x 64 x f32>) -> tensor<2xi64>",
    )
)

register(
    OpDef(
        name="core.size",
        summary="The number of elements of x as an i64 scalar.",
        operands=_X,
        attrs=(),
        infer=lambda ctx: [TensorType((), DType.i64)] if tensor_arg(ctx, 0, "x") else [],
        reference=lambda a, at: np.array(math.prod(a[0].shape), dtype=np.int64),
        smt=encoding("core_smt", "size"),
        verifies="x is a tensor.",
        example="%n = core.size %x : (tensor<?b x 64 x f32>) -> tensor<i64>",
    )
)


def _infer_identity(ctx: InferCtx) -> list[Type]:
    t = ctx.types[0]
    if not is_type(t):
        raise OpVerifyError(f"x must be a tensor or a KV cache, got {t}")
    return [t]


register(
    OpDef(
        name="core.identity",
        summary="x itself.",
        operands=_X,
        attrs=(),
        infer=_infer_identity,
        reference=lambda a, at: a[0],
        smt=encoding("core_smt", "identity"),
        interval=ranges.iv_first,
        cost=ranges.cost_view,
        traits=frozenset({"view"}),
        verifies="the result has x's type.",
        example="%y = core.identity %x : (tensor<?n x 4 x f16>) -> tensor<?n x 4 x f16>",
    )
)


# -- trilu, cumsum, argmax/argmin, top_k ----------------------------------------------------


def _infer_trilu(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    if x.rank < 2:
        raise OpVerifyError(f"x must have rank >= 2, got {x.rank}")
    if len(ctx.types) > 1:
        k = tensor_arg(ctx, 1, "k")
        if k.dtype != DType.i64 or k.shape not in ((), (1,)):
            raise OpVerifyError(f"k must be an i64 scalar, got {k}")
    return [x]


def _ref_trilu(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    k = int(args[1].reshape(-1)[0]) if len(args) > 1 else 0
    return np.triu(x, k) if attrs["upper"] else np.tril(x, k)


register(
    OpDef(
        name="core.trilu",
        summary="Keep the upper (or lower) triangle of the last two dims from diagonal k on; zero the rest.",
        operands=(
            Operand("x"),
            Operand("k", optional=True, doc="i64 scalar diagonal offset, default 0"),
        ),
        attrs=(Attr("upper", "bool", True),),
        infer=_infer_trilu,
        reference=_ref_trilu,
        smt=encoding("core_smt", "trilu"),
        interval=lambda op, ins, env, max_dim: ranges.union(ins[0], (0.0, 0.0)),
        verifies="x has rank >= 2 and k, when given, is an i64 scalar.",
        example="%y = core.trilu %x {upper = false} : (tensor<?s x ?s x f32>) -> tensor<?s x ?s x f32>",
    )
)


def _infer_cumsum(ctx: InferCtx) -> list[Type]:
    x = numeric_tensor(ctx, 0, "x")
    if x.rank == 0:
        raise OpVerifyError("cumsum needs rank >= 1")
    norm_axis(ctx["axis"], x.rank)
    return [x]


def _ref_cumsum(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = args[0]
    ax = attrs["axis"] % x.ndim
    a = x.astype(np.float64) if is_float_array(x) else x
    if attrs["reverse"]:
        a = np.flip(a, ax)
    c = np.cumsum(a, axis=ax, dtype=a.dtype)
    if attrs["exclusive"]:
        c = np.roll(c, 1, axis=ax)
        first = [slice(None)] * x.ndim
        first[ax] = slice(0, 1)
        c[tuple(first)] = 0
    if attrs["reverse"]:
        c = np.flip(c, ax)
    return np.ascontiguousarray(c).astype(x.dtype)


register(
    OpDef(
        name="core.cumsum",
        summary="Running sum along `axis`; exclusive leaves out the element itself, reverse runs from the end.",
        operands=_X,
        attrs=(
            Attr("axis", "int"),
            Attr("exclusive", "bool", False),
            Attr("reverse", "bool", False),
        ),
        infer=_infer_cumsum,
        reference=_ref_cumsum,
        smt=encoding("core_smt", "cumsum"),
        interval=ranges.iv_cumsum,
        verifies="x is numeric with rank >= 1 and axis is in range.",
        example="%y = core.cumsum %m {axis = 1} : (tensor<?b x ?s x i64>) -> tensor<?b x ?s x i64>",
    )
)


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> list[Dim]:
    if keepdims:
        return [1 if i in axes else d for i, d in enumerate(shape)]
    return [d for i, d in enumerate(shape) if i not in axes]


def _infer_arg(ctx: InferCtx) -> list[Type]:
    x = numeric_tensor(ctx, 0, "x")
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1")
    ax = norm_axis(ctx["axis"], x.rank)
    if x.shape[ax] == 0:
        raise OpVerifyError(f"cannot take {ctx.op.name.split('.')[1]} over axis {ax} of size 0")
    return [TensorType(tuple(reduced_shape(x.shape, [ax], ctx["keepdims"])), DType.i64)]


def _ref_arg(fn: Any) -> Any:
    def run(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        x = args[0]
        ax = attrs["axis"] % x.ndim
        a = x.astype(np.float64) if is_float_array(x) else x
        if attrs["select_last_index"]:
            a = np.flip(a, ax)
        i = fn(a, axis=ax, keepdims=attrs["keepdims"])
        if attrs["select_last_index"]:
            i = x.shape[ax] - 1 - i
        return np.asarray(i, dtype=np.int64)

    return run


for _name, _fn in (("argmax", np.argmax), ("argmin", np.argmin)):
    _what = "largest" if _name == "argmax" else "smallest"
    register(
        OpDef(
            name=f"core.{_name}",
            summary=f"The i64 index of the {_what} element along `axis` (the first one on ties, the last "
            "with select_last_index).",
            operands=_X,
            attrs=(
                Attr("axis", "int", 0),
                Attr("keepdims", "bool", True),
                Attr("select_last_index", "bool", False),
            ),
            infer=_infer_arg,
            reference=_ref_arg(_fn),
            smt=encoding("core_smt", _name),
            interval=ranges.iv_index,
            cost=ranges.cost_reduce(),
            verifies="x is numeric and axis is in range and not of size 0.",
            example=f"%i = core.{_name} %logits {{axis = -1, keepdims = false}} : "
            "(tensor<?b x 49152 x f32>) -> tensor<?b x i64>",
        )
    )


def _infer_top_k(ctx: InferCtx) -> list[Type]:
    x = numeric_tensor(ctx, 0, "x")
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1")
    ax = norm_axis(ctx["axis"], x.rank)
    k = ctx["k"]
    d = x.shape[ax]
    if k < 0 or (isinstance(d, int) and k > d):
        raise OpVerifyError(f"k = {k} must be in 0..{format_dim(d)} (the size of axis {ax})")
    shape = list(x.shape)
    shape[ax] = k
    return [like(x, shape), TensorType(tuple(shape), DType.i64)]


def _ref_top_k(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = args[0]
    ax = attrs["axis"] % x.ndim
    n, k = x.shape[ax], attrs["k"]
    if k > n:
        raise ValueError(f"k = {k} is larger than axis {ax} ({n})")
    a = x.astype(np.float64) if is_float_array(x) else x
    if attrs["largest"]:
        # stable ascending sort of the reversed axis, reversed again: descending, and among equal
        # values the lower index first (ONNX's tie rule)
        order = n - 1 - np.flip(np.argsort(np.flip(a, ax), axis=ax, kind="stable"), ax)
    else:
        order = np.argsort(a, axis=ax, kind="stable")
    idx = np.take(order, np.arange(k), axis=ax).astype(np.int64)
    return [np.take_along_axis(x, idx, axis=ax), idx]


register(
    OpDef(
        name="core.top_k",
        summary="The k largest (or smallest) elements along `axis` and their i64 indices, in sorted order; "
        "equal values keep the lower index first.",
        operands=_X,
        attrs=(
            Attr("k", "int"),
            Attr("axis", "int", -1),
            Attr("largest", "bool", True),
            Attr("sorted", "bool", True),
        ),
        infer=_infer_top_k,
        reference=_ref_top_k,
        results=("values", "indices"),
        smt=encoding("core_smt", "top_k"),
        interval=ranges.iv_first,
        cost=ranges.cost_reduce(),
        verifies="x is numeric, axis is in range and 0 <= k <= the axis size.",
        example="%v, %i = core.top_k %logits {k = 40} : (tensor<?b x 49152 x f32>) "
        "-> (tensor<?b x 40 x f32>, tensor<?b x 40 x i64>)",
    )
)

__all__ = ["is_float_array", "numeric_tensor", "reduced_shape"]
