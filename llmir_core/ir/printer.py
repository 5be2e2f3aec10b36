"""The canonical text form of a module. Deterministic: the same module prints the same bytes."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .attrs import DenseAttr
from .core import Function, Module, Op
from .dims import SymDim, _Dyn, format_dim
from .types import DType, KVCacheType, QuantType, TensorType, Type

INDENT = "  "


def format_type(t: Type) -> str:
    return str(t)


def _format_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(float(x))
    return r


def _format_scalar(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return _format_float(float(x))


def _format_nested(arr: np.ndarray) -> str:
    if arr.ndim == 0:
        return _format_scalar(arr.item() if arr.dtype.kind in "biu" else float(arr))
    return "[" + ", ".join(_format_nested(a) for a in arr) + "]"


def format_dense(d: DenseAttr) -> str:
    arr = d.array
    flat = arr.reshape(-1)
    if arr.ndim > 0 and flat.size > 1 and (flat == flat[0]).all() and not (
            arr.dtype.kind == "f" and np.isnan(flat.astype(np.float64)).any()):
        body = _format_nested(flat[0:1].reshape(()))
    else:
        body = _format_nested(arr if arr.dtype.kind in "biuf" else arr.astype(np.float64))
    return f"dense<{body}> : {d.type}"


def format_attr(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _format_float(v)
    if isinstance(v, DType):
        return v.value
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (SymDim, _Dyn)):
        return format_dim(v)
    if isinstance(v, (TensorType, KVCacheType, QuantType)):
        return str(v)
    if isinstance(v, DenseAttr):
        return format_dense(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, dict):
        return format_attr_dict(v)
    if v is None:
        return "none"
    raise TypeError(f"cannot print attribute value of type {type(v).__name__}")


def format_attr_dict(d: dict[str, Any]) -> str:
    items = ", ".join(f"{_format_key(k)} = {format_attr(d[k])}" for k in sorted(d))
    return "{" + items + "}"


def _format_key(k: str) -> str:
    if k and (k[0].isalpha() or k[0] == "_") and all(c.isalnum() or c in "_.$" for c in k):
        return k
    return json.dumps(k)


def _types(ts: list[Type]) -> str:
    return ", ".join(str(t) for t in ts)


def format_op(op: Op) -> str:
    parts = []
    if op.results:
        parts.append(", ".join("%" + r.name for r in op.results) + " = ")
    parts.append(op.name)
    if op.operands:
        parts.append(" " + ", ".join("%" + v.name for v in op.operands))
    if op.attrs:
        parts.append(" " + format_attr_dict(op.attrs))
    outs = [r.type for r in op.results]
    out_text = str(outs[0]) if len(outs) == 1 else f"({_types(outs)})"
    parts.append(f" : ({_types([v.type for v in op.operands])}) -> {out_text}")
    if op.origin is not None:
        parts.append(f" loc({json.dumps(op.origin, ensure_ascii=False)})")
    return "".join(parts)


def format_function(f: Function) -> list[str]:
    args = ", ".join(f"%{a.name}: {a.type}" for a in f.args)
    outs = f.output_types
    sig = f"func.func @{f.name}({args})"
    if len(outs) == 1:
        sig += f" -> {outs[0]}"
    elif outs:
        sig += f" -> ({_types(outs)})"
    if f.attrs:
        sig += " attributes " + format_attr_dict(f.attrs)
    lines = [INDENT + sig + " {"]
    ind = INDENT * 2
    lines.extend(ind + format_op(op) for op in f.ops)
    if f.outputs:
        names = ", ".join("%" + v.name for v in f.outputs)
        lines.append(f"{ind}return {names} : {_types(outs)}")
    else:
        lines.append(ind + "return")
    lines.append(INDENT + "}")
    return lines


def print_module(m: Module) -> str:
    header = f"module @{m.name}"
    if m.attrs:
        header += " attributes " + format_attr_dict(m.attrs)
    lines = [header + " {"]
    for i, f in enumerate(m.functions):
        if i:
            lines.append("")
        lines.extend(format_function(f))
    lines.append("}")
    return "\n".join(lines) + "\n"
