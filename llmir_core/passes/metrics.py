"""Static cost estimates for the optimize report: op counts, parameter bytes, FLOPs and memory
traffic per token.

An op's cost is on its declaration (`OpDef.cost`, rules in `llmir_core.dialects.ranges`).
Per token means: every named symbolic dim is bound to 1 (batch 1, one new token) unless the
caller binds it (`dims={"past": 512}`); anonymous `?` dims count as 1. Memory traffic is the
bytes each op reads and writes (its operands and results), so a fusion that removes
intermediate tensors shows up as less traffic. Parameters are `core.weight` and `core.constant`
results and static-shaped function arguments of rank >= 2 (weights passed as arguments); ops
computed from parameters alone (a concatenated QKV weight) run once at load time and are not
counted per token.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from llmir_core.dialects import ranges
from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Module, Op, Value
from llmir_core.ir.dims import SymDim
from llmir_core.ir.types import TensorType


@dataclass
class Metrics:
    ops: int = 0
    op_counts: dict[str, int] = field(default_factory=dict)
    param_bytes: int = 0
    flops_per_token: int = 0
    bytes_per_token: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "op_counts": dict(sorted(self.op_counts.items())),
            "param_bytes": self.param_bytes,
            "flops_per_token": self.flops_per_token,
            "memory_bytes_per_token": self.bytes_per_token,
        }


nbytes = ranges.nbytes


def _env(module: Module, dims: dict[str, int] | None) -> dict[str, int]:
    env: dict[str, int] = {}
    for fn in module.functions:
        for v in fn.values():
            t = v.type
            shape = t.shape if isinstance(t, TensorType) else ()
            for d in shape:
                if isinstance(d, SymDim):
                    for n in d.names():
                        env.setdefault(n, 1)
    env.update(dims or {})
    return env


def op_cost(op: Op, env: dict[str, int]) -> tuple[int, int]:
    """(FLOPs, bytes read) of one evaluation: the op declaration's `cost`, else the generic rule
    (one FLOP per result element, every operand read once)."""
    od = get_op(op.name)
    if od is not None and od.cost is not None:
        return od.cost(op, env)
    return generic_cost(op, env)


generic_cost = ranges.cost_per_element(1)


def op_flops(op: Op, env: dict[str, int]) -> int:
    return op_cost(op, env)[0]


def is_view(op: Op) -> bool:
    """A view (`view` trait: reshape, identity) moves no data of its own."""
    od = get_op(op.name)
    return od is not None and "view" in od.traits


def _is_param_arg(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.rank >= 2 and t.static_shape() is not None


def measure(module: Module, dims: dict[str, int] | None = None) -> Metrics:
    env = _env(module, dims)
    m = Metrics()
    counts: Counter[str] = Counter()
    for fn in module.functions:
        m.param_bytes += sum(nbytes(a.type, env) for a in fn.args if _is_param_arg(a))
        static = {id(a) for a in fn.args if _is_param_arg(a)}  # computed once at load time
        for op in fn.ops:
            counts[op.name] += 1
            if op.name in ("core.weight", "core.constant"):
                m.param_bytes += sum(nbytes(r.type, env) for r in op.results)
                static.update(id(r) for r in op.results)
                continue
            if op.operands and all(id(v) in static for v in op.operands):
                static.update(id(r) for r in op.results)
                continue
            flops, read = op_cost(op, env)
            m.flops_per_token += flops
            if is_view(op):
                continue
            m.bytes_per_token += read + sum(nbytes(r.type, env) for r in op.results)
    m.ops = sum(counts.values())
    m.op_counts = dict(counts)
    return m
