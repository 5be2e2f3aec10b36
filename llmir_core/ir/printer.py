"""The canonical text form of a module. Deterministic: the same module prints the same bytes."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from .attrs import DenseAttr
from .core import Function, Module, Op, gc_paused
from .dims import SymDim, _Dyn, format_dim
from .types import DType, KVCacheType, QuantType, TensorType, Type

INDENT = "  "


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
    if arr.dtype.kind not in "biuf":  # ml_dtypes (bf16, f8, int4): print as Python numbers
        is_int = isinstance(d.type.dtype, DType) and d.type.dtype.is_int
        arr = arr.astype(np.int64 if is_int else np.float64)
    flat = arr.reshape(-1)
    # a splat only when every element has the same bytes (0.0 == -0.0, but they differ)
    if arr.ndim > 0 and flat.size > 1 and flat.tobytes() == flat[:1].tobytes() * flat.size:
        body = _format_nested(flat[0:1].reshape(()))
    else:
        body = _format_nested(arr)
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
        return format_string(v)
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


_BARE_KEY = re.compile(r"[A-Za-z_][\w.$]*")
_BARE_SYMBOL = re.compile(r"[\w.$]+")


def _format_key(k: str) -> str:
    # bare when the tokenizer reads it back as one identifier ("inf"/"nan" read as numbers)
    if _BARE_KEY.fullmatch(k) and k not in ("inf", "nan"):
        return k
    return json.dumps(k, ensure_ascii=False)


def format_symbol(name: str) -> str:
    """`@name`, quoted (`@"my model"`) when the name is not made of word characters, '.', '$'."""
    if _BARE_SYMBOL.fullmatch(name):
        return "@" + name
    return "@" + json.dumps(name, ensure_ascii=False)


def _types(ts: list[Type]) -> str:
    return ", ".join([str(t) for t in ts])


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')


def format_string(s: str) -> str:
    """A JSON string literal (the parser's string syntax); quick when nothing needs escaping."""
    if _NEEDS_ESCAPE.search(s) is None:
        return f'"{s}"'
    return json.dumps(s, ensure_ascii=False)


def format_op(op: Op) -> str:
    results = op.results
    if len(results) == 1:
        r = results[0]
        text = f"%{r.name} = {op.name}"
        out_text = str(r.type)
    elif results:
        text = ", ".join(["%" + r.name for r in results]) + " = " + op.name
        out_text = f"({_types([r.type for r in results])})"
    else:
        text, out_text = op.name, "()"
    if op.operands:
        text += " " + ", ".join(["%" + v.name for v in op.operands])
    if op.attrs:
        text += " " + format_attr_dict(op.attrs)
    text += f" : ({_types([v.type for v in op.operands])}) -> {out_text}"
    if op.origin is not None:
        text += f" loc({format_string(op.origin)})"
    return text


def format_function(f: Function) -> list[str]:
    args = ", ".join(f"%{a.name}: {a.type}" for a in f.args)
    outs = f.output_types
    sig = f"func.func {format_symbol(f.name)}({args})"
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
    with gc_paused():
        return _print_module(m)


def _print_module(m: Module) -> str:
    header = f"module {format_symbol(m.name)}"
    if m.attrs:
        header += " attributes " + format_attr_dict(m.attrs)
    lines = [header + " {"]
    for i, f in enumerate(m.functions):
        if i:
            lines.append("")
        lines.extend(format_function(f))
    lines.append("}")
    return "\n".join(lines) + "\n"
