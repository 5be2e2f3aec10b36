"""The value of a tensor computed from parameters alone (weights, constants and ops over them),
evaluated at compile time with the reference interpreter: what data-dependent preconditions
(a rotary table repeats its halves) and build-time transforms (quantizing a weight) read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.interp import Interpreter
from llmir_core.ir.core import Module, Op, Value

MAX_SLICE_OPS = 64  # a longer parameter-only subgraph is left to run time


def static_slice(v: Value) -> list[Op] | None:
    """The ops computing v, in definition order, when none reads a function argument."""
    seen: dict[int, Op] = {}
    stack = [v]
    while stack:
        x = stack.pop()
        op = x.owner
        if op is None:
            return None  # a function argument: known only at run time
        if id(op) in seen:
            continue
        seen[id(op)] = op
        if len(seen) > MAX_SLICE_OPS:
            return None
        stack.extend(op.operands)
    return _ordered(list(seen.values()))


def _ordered(ops: list[Op]) -> list[Op]:
    done: set[int] = set()
    out: list[Op] = []

    def visit(op: Op) -> None:
        if id(op) in done:
            return
        done.add(id(op))
        for v in op.operands:
            if v.owner is not None:
                visit(v.owner)
        out.append(op)

    for op in ops:
        visit(op)
    return out


def static_value(module: Module, v: Value) -> Any | None:
    """v's value (an ndarray, or a PackedArray for quantized weights), or None when it depends
    on a function argument, its subgraph is too long, or it cannot be evaluated (a missing
    weight file)."""
    ops = static_slice(v)
    if ops is None:
        return None
    it = Interpreter(module)
    vals: dict[int, Any] = {}
    try:
        for op in ops:
            outs = it.eval_op(op, [vals[id(x)] for x in op.operands], {})
            for r, o in zip(op.results, outs):
                vals[id(r)] = o
    except Exception:  # noqa: BLE001 - e.g. the weight file is missing: no value
        return None
    out = vals.get(id(v))
    return np.asarray(out) if isinstance(out, np.ndarray) else out
