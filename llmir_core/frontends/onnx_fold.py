"""What the ONNX importer knows at import time about small integer tensors.

Exported graphs compute shapes at run time (`Shape -> Gather -> Concat -> Reshape`). Tracking the
contents of those small tensors, as numbers or as symbolic dims (`[?batch, ?seq, 9, 64]`), lets the
importer emit `core.reshape {shape = [?batch, ?seq, 9, 64]}` instead of a run-time reshape; the
shape arithmetic it no longer needs is then dropped as dead code. Numeric constants are folded
with the ops' own reference semantics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from llmir_core.ir.core import Op
from llmir_core.ir.dims import DYN, Dim, SymDim, dim_add, dim_div_exact, dim_mul, dim_sub
from llmir_core.ir.types import TensorType

if TYPE_CHECKING:
    from .onnx import _Importer

LIMIT = 65536  # largest result (elements) folded at import time


def dims_array(dims: list[Dim] | tuple[Dim, ...]) -> np.ndarray:
    """Dims as a known value: int64 when all static, else an object array of dims."""
    if all(isinstance(d, int) for d in dims):
        return np.array(dims, dtype=np.int64)
    out = np.empty(len(dims), dtype=object)
    for i, d in enumerate(dims):
        out[i] = d
    return out


def _normalize(arr: Any) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        box = np.empty((), dtype=object)
        box[()] = arr
        arr = box
    if arr.dtype == object and all(isinstance(x, (int, np.integer)) for x in arr.reshape(-1)):
        return arr.astype(np.int64)
    return arr


def _as_obj(a: np.ndarray) -> np.ndarray:
    if a.dtype == object:
        return a
    out = np.empty(a.shape, dtype=object)
    for idx, v in np.ndenumerate(a):
        out[idx] = int(v)
    return out


def _dim_div(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return DYN
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return dim_div_exact(a, b)


_ARITH: dict[str, Callable[[Dim, Dim], Dim]] = {
    "core.add": dim_add,
    "core.sub": dim_sub,
    "core.mul": dim_mul,
    "core.div": _dim_div,
}


def _shape_slice(rank: int, start: int, end: Any) -> slice:
    s = start + rank if start < 0 else start
    e = rank if end is None else (end + rank if end < 0 else end)
    return slice(max(0, min(s, rank)), max(0, min(e, rank)))


def _static_shape(op: Op, i: int = 0) -> tuple[int, ...] | None:
    t = op.results[i].type
    return t.static_shape() if isinstance(t, TensorType) else None


def _symbolic(op: Op, args: list[np.ndarray]) -> np.ndarray | None:
    name, at = op.name, op.attrs
    if any(a.ndim > 1 for a in args):
        return None
    if name in ("core.identity", "core.cast"):
        return args[0]
    if name == "core.gather" and at.get("axis", 0) in (0, -1) and args[1].dtype != object:
        return args[0][args[1].astype(np.int64)]
    if name == "core.concat" and len(args) > 0:
        return np.concatenate([_as_obj(a).reshape(-1) for a in args])
    if name in ("core.unsqueeze", "core.squeeze", "core.reshape", "core.flatten"):
        shape = _static_shape(op)
        return None if shape is None else args[0].reshape(shape)
    if name == "core.slice" and args[0].ndim == 1:
        axes = at.get("axes") or (0,)
        steps = at.get("steps") or (1,)
        if tuple(axes) not in ((0,), (-1,)):
            return None
        return args[0][slice(at["starts"][0], at["ends"][0], steps[0])]
    if name in _ARITH:
        a, b = np.broadcast_arrays(_as_obj(args[0]), _as_obj(args[1]))
        out = np.empty(a.shape, dtype=object)
        fn = _ARITH[name]
        for idx in np.ndindex(a.shape):
            x: Any = a[idx]
            y: Any = b[idx]
            out[idx] = fn(x, y)
        return out
    return None


def propagate(imp: _Importer, op: Op) -> None:  # noqa: C901 (one case per ONNX shape op)
    """Record the known contents of op's results in imp.known."""
    known = imp.known
    if op.name == "core.constant":
        known[id(op.result)] = op.attrs["value"].array
        return
    if op.name == "core.shape":
        t = op.operands[0].type
        if isinstance(t, TensorType):
            sl = _shape_slice(t.rank, op.attrs.get("start", 0), op.attrs.get("end"))
            known[id(op.result)] = dims_array(t.shape[sl])
        return
    if op.name == "core.size":
        t = op.operands[0].type
        if isinstance(t, TensorType):
            total: Dim = 1
            for d in t.shape:
                total = dim_mul(total, d)
            if total is not DYN:
                known[id(op.result)] = dims_array([total]).reshape(())
        return
    if not op.operands or op.name in ("core.weight",):
        return
    args = [known.get(id(v)) for v in op.operands]
    if any(a is None for a in args):
        return
    arrays = [a for a in args if a is not None]
    if any(a.dtype == object for a in arrays):
        try:
            res = _symbolic(op, arrays)
        except (IndexError, ValueError, TypeError):
            res = None
        if res is not None and len(op.results) == 1:
            known[id(op.result)] = _normalize(res)
        return
    if any(a.size > LIMIT for a in arrays):
        return
    for r in op.results:
        t = r.type
        if not isinstance(t, TensorType):
            return
        shape = t.static_shape()
        if shape is not None and int(np.prod(shape)) > LIMIT:
            return
    outs = imp._interp_eval(op, arrays)
    if outs is None:
        return
    for r, o in zip(op.results, outs):
        if isinstance(o, np.generic):  # numpy ops on 0-d arrays return scalars
            o = np.asarray(o)
        if isinstance(o, np.ndarray) and o.size <= LIMIT:
            known[id(r)] = o


__all__ = ["propagate", "dims_array", "SymDim"]
