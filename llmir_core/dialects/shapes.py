"""Shape-rule helpers over symbolic dims, shared by the op declarations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmir_core.ir.dims import DYN, Dim, SymDim, dim_mul
from llmir_core.ir.types import DType, KVCacheType, TensorType, Type

from .opdef import InferCtx, OpVerifyError


def tensor_arg(ctx: InferCtx, i: int, what: str = "") -> TensorType:
    t = ctx.types[i]
    if not isinstance(t, TensorType):
        raise OpVerifyError(
            f"operand #{i}{' (' + what + ')' if what else ''} must be a tensor, got {t}"
        )
    return t


def float_tensor(ctx: InferCtx, i: int, what: str = "") -> TensorType:
    t = tensor_arg(ctx, i, what)
    if not isinstance(t.dtype, DType) or not t.dtype.is_float:
        raise OpVerifyError(
            f"operand #{i}{' (' + what + ')' if what else ''} must have a float dtype, got {t.dtype}"
        )
    return t


def kv_arg(ctx: InferCtx, i: int) -> KVCacheType:
    t = ctx.types[i]
    if not isinstance(t, KVCacheType):
        raise OpVerifyError(f"operand #{i} must be a !llm.kv_cache, got {t}")
    return t


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    if a == b and a is not DYN:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise OpVerifyError(f"dims {a} and {b} do not broadcast")
    if isinstance(a, int):
        return a  # b is symbolic or ?: it must equal a (or be 1)
    if isinstance(b, int):
        return b
    return DYN


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = [1] * (rank - len(s)) + list(s)
        for i, d in enumerate(padded):
            try:
                out[i] = broadcast_dim(out[i], d)
            except OpVerifyError:
                raise OpVerifyError(
                    "shapes " + " and ".join(fmt_shape(x) for x in shapes) + " do not broadcast"
                ) from None
    return tuple(out)


def fmt_shape(s: Sequence[Dim]) -> str:
    from llmir_core.ir.dims import format_dim

    return "[" + ", ".join(format_dim(d) for d in s) + "]"


def same_dtype(ctx: InferCtx, idxs: Sequence[int] | None = None) -> DType:
    idxs = list(range(len(ctx.types))) if idxs is None else list(idxs)
    dts = [tensor_arg(ctx, i).dtype for i in idxs]
    first = dts[0]
    for i, d in zip(idxs, dts):
        if d != first:
            raise OpVerifyError(
                f"operand dtypes differ: #{idxs[0]} is {first}, #{i} is {d} (insert core.cast)"
            )
    if not isinstance(first, DType):
        raise OpVerifyError(
            f"quantized operand ({first}) needs llm.dequantize or llm.quantized_matmul"
        )
    return first


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1) or (rank == 0 and axis not in (0, -1)):
        raise OpVerifyError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    out = [norm_axis(a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise OpVerifyError(f"axes {list(axes)} repeat an axis")
    return out


def prod_dims(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = dim_mul(out, d)
    return out


def like(t: TensorType, shape: Sequence[Dim] | None = None, dtype: Any = None) -> TensorType:
    return TensorType(
        tuple(t.shape if shape is None else shape),
        t.dtype if dtype is None else dtype,
        t.layout,
        t.device,
        t.sema,
    )


def dims_of(attr_dims: Sequence[Any]) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for d in attr_dims:
        if isinstance(d, bool) or not isinstance(d, (int, SymDim)) and d is not DYN:
            raise OpVerifyError(f"expected a dimension, got {d!r}")
        out.append(d)
    return tuple(out)


def is_type(t: Type) -> bool:
    return isinstance(t, (TensorType, KVCacheType))
