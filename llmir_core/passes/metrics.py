"""Static cost estimates for the optimize report: op counts, parameter bytes, FLOPs and memory
traffic per token.

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

from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Module, Op, Value
from llmir_core.ir.dims import SymDim, eval_dim
from llmir_core.ir.types import DType, KVCacheType, QuantType, TensorType


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


def _numel(t: Any, env: dict[str, int]) -> int:
    if isinstance(t, KVCacheType):
        ml = eval_dim(t.max_len, env) or 1
        return 2 * t.layers * t.kv_heads * ml * t.head_dim
    if not isinstance(t, TensorType):
        return 0
    n = 1
    for d in t.shape:
        v = eval_dim(d, env) if isinstance(d, (int, SymDim)) else None
        n *= max(v if v is not None else 1, 0)
    return n


def _elem_bits(t: Any) -> float:
    dt = t.dtype
    if isinstance(dt, QuantType):
        return dt.block_bytes * 8 / (dt.super_block or dt.block)
    if isinstance(dt, DType):
        return dt.bits
    return 32


def nbytes(t: Any, env: dict[str, int]) -> int:
    return int(_numel(t, env) * _elem_bits(t) / 8)


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
    """(FLOPs, bytes read) of one evaluation: the op declaration's `cost`, else the generic
    estimate (`generic_flops`, every operand read once; views read nothing)."""
    od = get_op(op.name)
    if od is not None and od.cost is not None:
        return od.cost(op, env)
    read = 0 if op.name in VIEWS else sum(nbytes(v.type, env) for v in op.operands)
    return generic_flops(op, env), read


VIEWS = ("core.reshape", "core.identity")  # no data movement of their own


def op_flops(op: Op, env: dict[str, int]) -> int:
    return op_cost(op, env)[0]


def generic_flops(op: Op, env: dict[str, int]) -> int:
    """The FLOP estimate of ops without a declared `cost`: the known kernels by name, else one
    FLOP per result element."""
    out = sum(_numel(r.type, env) for r in op.results)
    ins = [_numel(v.type, env) for v in op.operands]
    name = op.name
    if name in ("core.matmul", "llm.quantized_matmul"):
        a = op.operands[0].type
        k = 1
        if isinstance(a, TensorType) and a.rank:
            d = a.shape[-2] if op.attrs.get("transpose_a") and a.rank >= 2 else a.shape[-1]
            k = eval_dim(d, env) or 1 if isinstance(d, (int, SymDim)) else 1
        return 2 * out * k
    if name == "llm.gated_mlp":
        x, wg = op.operands[0].type, op.operands[1].type
        tokens = _numel(x, env) // max(_last(x, env), 1)
        return 2 * 3 * tokens * _numel(wg, env)
    if name == "llm.scaled_dot_product_attention":
        q, kt = op.operands[0].type, op.operands[1].type
        skv = _dim(kt, -2, env)
        return 4 * _numel(q, env) * skv
    if name in ("llm.rms_norm", "llm.layer_norm"):
        return 4 * out
    if name.startswith("core.reduce") or name in ("core.softmax", "core.log_softmax"):
        return max(ins[0] if ins else 0, out) * (3 if "softmax" in name else 1)
    if name in ("core.constant", "core.weight", "core.reshape", "core.transpose", "core.identity"):
        return 0
    return out


def _last(t: Any, env: dict[str, int]) -> int:
    return _dim(t, -1, env)


def _dim(t: Any, i: int, env: dict[str, int]) -> int:
    if not isinstance(t, TensorType) or not t.rank:
        return 1
    d = t.shape[i]
    v = eval_dim(d, env) if isinstance(d, (int, SymDim)) else None
    return v or 1


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
            if op.name in VIEWS:
                continue
            m.bytes_per_token += read + sum(nbytes(r.type, env) for r in op.results)
    m.ops = sum(counts.values())
    m.op_counts = dict(counts)
    return m
