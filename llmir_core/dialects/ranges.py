"""Interval and cost rules for op declarations (`OpDef.interval`, `OpDef.cost`): sound bounds
[lo, hi] on a result from its operands' bounds (`iv_*`), and FLOPs and bytes read per evaluation
(`cost_*`). Pure Python, so dialect modules name them directly; `llmir_core.smt.intervals`
propagates ranges through a module and `llmir_core.passes.metrics` sums costs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from llmir_core.ir.dims import SymDim, eval_dim
from llmir_core.ir.types import DType, KVCacheType, QuantType, TensorType

INF = math.inf
Iv = tuple[float, float]


def mul(a: Iv, b: Iv) -> Iv:
    ps = [
        x * y
        for x in a
        for y in b
        if not (math.isinf(x) and y == 0) and not (math.isinf(y) and x == 0)
    ]
    return (min(ps, default=-INF), max(ps, default=INF))


def absmax(a: Iv) -> float:
    return max(abs(a[0]), abs(a[1]))


def union(*ivs: Iv) -> Iv:
    return (min(i[0] for i in ivs), max(i[1] for i in ivs))


def dim(t: Any, i: int, env: dict[str, int], default: int) -> int:
    """Dim i of type t under the bindings env (`default` for an unbound symbolic dim)."""
    if not isinstance(t, TensorType) or not t.rank:
        return 1
    d = t.shape[i]
    v = eval_dim(d, env) if isinstance(d, (int, SymDim)) else None
    return v if v is not None else default


def numel(t: Any, env: dict[str, int]) -> int:
    """Elements of t with unbound symbolic dims counted as 1 (per-token costs)."""
    if not isinstance(t, TensorType):
        return 0
    return math.prod(max(dim(t, i, env, 1), 0) for i in range(t.rank))


def norm_bound(n: int, w: Iv, offset: float) -> Iv:
    """|x / rms(x) * (w + offset)| <= sqrt(n) * max|w + offset| (each |x_i| <= sqrt(n) * rms)."""
    m = math.sqrt(n) * absmax((w[0] + offset, w[1] + offset))
    return (-m, m)


def activation(kind: str, a: Iv) -> Iv:
    """The image of [lo, hi] under an activation (silu and gelu are >= -0.28)."""
    if kind == "none":
        return a
    if kind == "relu":
        return (max(a[0], 0.0), max(a[1], 0.0))
    return (-0.28, max(a[1], 0.0))


# -- interval rules (`OpDef.interval`): (op, operand ranges, dim bindings, default dim) -> range --

IntervalRule = Callable[[Any, list[Iv], dict[str, int], int], Iv]


def iv_first(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    """The result's elements are elements (or means, maxima) of the first operand."""
    return ins[0]


def iv_operand(i: int) -> IntervalRule:
    """The result's elements are convex combinations of operand i's (attention and v)."""
    return lambda op, ins, env, max_dim: ins[i]


def iv_fixed(lo: float, hi: float) -> IntervalRule:
    return lambda op, ins, env, max_dim: (lo, hi)


def iv_union(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return union(*ins)


def iv_constant(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    arr = np.asarray(op.attrs["value"].array, dtype=np.float64)
    return (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)


def iv_add(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return (ins[0][0] + ins[1][0], ins[0][1] + ins[1][1])


def iv_sub(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return (ins[0][0] - ins[1][1], ins[0][1] - ins[1][0])


def iv_mul(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return mul(ins[0], ins[1])


def iv_div(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    b = ins[1]
    return (-INF, INF) if b[0] <= 0 <= b[1] else mul(ins[0], (1 / b[1], 1 / b[0]))


def iv_pow(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    """Only squares are bounded."""
    a = ins[0]
    if ins[1] != (2.0, 2.0):
        return (-INF, INF)
    m = absmax(a)
    return (0.0 if a[0] <= 0 <= a[1] else min(a[0] ** 2, a[1] ** 2), m * m)


def iv_max(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return (max(ins[0][0], ins[1][0]), max(ins[0][1], ins[1][1]))


def iv_min(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return (min(ins[0][0], ins[1][0]), min(ins[0][1], ins[1][1]))


def iv_neg(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return (-ins[0][1], -ins[0][0])


def iv_abs(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    a = ins[0]
    return (0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1])), absmax(a))


def iv_relu(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return (max(ins[0][0], 0.0), max(ins[0][1], 0.0))


def iv_silu(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    """silu and gelu are >= -0.28 and at most max(x, 0)."""
    return (-0.28, max(ins[0][1], 0.0))


def iv_exp(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    a = ins[0]
    return (math.exp(min(a[0], 700)), math.exp(min(a[1], 700)) if a[1] < 700 else INF)


def iv_monotone(f: Callable[[float], float]) -> IntervalRule:
    """A nondecreasing function (floor, ceil, round)."""
    return lambda op, ins, env, max_dim: (f(ins[0][0]), f(ins[0][1]))


def iv_monotone_positive(f: Callable[[float], float], log: bool = False) -> IntervalRule:
    """sqrt, rsqrt, log, reciprocal: monotone on (0, inf); unbounded when 0 may be reached."""

    def rule(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
        a = ins[0]
        if a[0] <= 0:
            return (-INF, INF) if log else (0.0, INF)
        lo, hi = f(a[0]), f(a[1])
        return (min(lo, hi), max(lo, hi))

    return rule


def _finite(f: Callable[[float], float]) -> Callable[[float], float]:
    return lambda v: v if math.isinf(v) else float(f(v))


iv_floor = iv_monotone(_finite(math.floor))
iv_ceil = iv_monotone(_finite(math.ceil))
iv_round = iv_monotone(_finite(round))


def iv_matmul(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    """|sum_k a_k b_k| <= K max|a| max|b|."""
    k = dim(op.operands[0].type, -2 if op.attrs.get("transpose_a") else -1, env, max_dim)
    m = k * absmax(ins[0]) * absmax(ins[1])
    return (-m, m)


def iv_gated_mlp(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    k = dim(op.operands[0].type, -1, env, max_dim)
    f = dim(op.operands[1].type, 0, env, max_dim)
    g = k * absmax(ins[0]) * absmax(ins[1])
    u = k * absmax(ins[0]) * absmax(ins[2])
    m = f * max(g, 0.28) * u * absmax(ins[3])
    return (-m, m)


def iv_reduce_sum(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    a = ins[0]
    cnt = 1
    t = op.operands[0].type
    axes = op.attrs.get("axes", ()) or tuple(range(t.rank if isinstance(t, TensorType) else 0))
    for ax in axes:
        cnt *= dim(t, ax, env, max_dim)
    return (a[0] * cnt if a[0] < 0 else a[0], a[1] * cnt if a[1] > 0 else a[1])


def iv_cumsum(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    a = ins[0]
    n = dim(op.operands[0].type, op.attrs["axis"], env, max_dim)
    return (min(a[0] * n, 0.0), max(a[1] * n, 0.0))


def iv_pad(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    v = float(op.attrs.get("value", 0.0))
    return union(ins[0], (v, v)) if op.attrs.get("mode", "constant") == "constant" else ins[0]


def iv_where(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return union(ins[1], ins[2])


def iv_index(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    """An index along operand 0's `axis` (argmax, argmin): [0, n - 1]."""
    t = op.operands[0].type
    return (0.0, float(dim(t, op.attrs.get("axis", -1), env, max_dim) - 1))


def iv_norm(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    """RMS norm: |x / rms(x) * (w + offset)| <= sqrt(n) max|w + offset|; layer norm adds bias."""
    lo, hi = norm_bound(
        dim(op.operands[0].type, -1, env, max_dim), ins[1], float(op.attrs.get("offset", 0.0))
    )
    if op.name == "llm.layer_norm" and len(ins) > 2:
        return (lo + ins[2][0], hi + ins[2][1])
    return (lo, hi)


def iv_add_norm(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    """(normed, sum) of a residual add and an RMS norm: one range for both results."""
    n = dim(op.operands[0].type, -1, env, max_dim)
    normed = norm_bound(n, ins[2], float(op.attrs.get("offset", 0.0)))
    return union(normed, (ins[0][0] + ins[1][0], ins[0][1] + ins[1][1]))


def iv_rotary(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    m = math.sqrt(2) * absmax(ins[0]) * max(absmax(ins[1]), absmax(ins[2]), 1.0)
    return (-m, m)


def iv_silu_mul(op: Any, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    return mul((-0.28, max(ins[0][1], 0.0)), ins[1])


# -- cost rules (`OpDef.cost`): (op, dim bindings) -> (FLOPs, bytes read) --------------------------

CostRule = Callable[[Any, dict[str, int]], tuple[int, int]]


def count(t: Any, env: dict[str, int]) -> int:
    """Elements of a tensor (a KV cache: its k and v buffers) with unbound dims counted as 1."""
    if isinstance(t, KVCacheType):
        ml = eval_dim(t.max_len, env) or 1
        return 2 * t.layers * t.kv_heads * ml * t.head_dim
    return numel(t, env)


def elem_bits(t: Any) -> float:
    dt = getattr(t, "dtype", None)
    if isinstance(dt, QuantType):
        return dt.block_bytes * 8 / (dt.super_block or dt.block)
    if isinstance(dt, DType):
        return dt.bits
    return 32


def nbytes(t: Any, env: dict[str, int]) -> int:
    return int(count(t, env) * elem_bits(t) / 8)


def read_all(op: Any, env: dict[str, int]) -> int:
    """Bytes of every operand, each read once."""
    return sum(nbytes(v.type, env) for v in op.operands)


def out_elems(op: Any, env: dict[str, int]) -> int:
    return sum(count(r.type, env) for r in op.results)


def cost_per_element(flops: int) -> CostRule:
    """`flops` per result element, every operand read once (the generic rule is 1)."""
    return lambda op, env: (flops * out_elems(op, env), read_all(op, env))


def cost_free(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """Data movement only: no FLOPs, every operand read once (transpose, constants)."""
    return 0, read_all(op, env)


def cost_view(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """A view (reshape, identity): no FLOPs and no data movement of its own."""
    return 0, 0


def cost_matmul(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """2 * K FLOPs per result element (a multiply and an add)."""
    k = dim(op.operands[0].type, -2 if op.attrs.get("transpose_a") else -1, env, 1)
    return 2 * out_elems(op, env) * k, read_all(op, env)


def cost_gated_mlp(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """Three projections of x through [inter, hidden] matrices: 2 * 3 * tokens * inter * hidden."""
    x, wg = op.operands[0].type, op.operands[1].type
    tokens = count(x, env) // max(dim(x, -1, env, 1), 1)
    return 2 * 3 * tokens * count(wg, env), read_all(op, env)


def cost_attention(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """q @ k^T and p @ v: 4 * |q| * Skv."""
    q, k = op.operands[0].type, op.operands[1].type
    return 4 * count(q, env) * dim(k, -2, env, 1), read_all(op, env)


def cost_reduce(per_input: int = 1) -> CostRule:
    """`per_input` FLOPs per input element (softmax: 3: max, exp and sum, divide)."""

    def rule(op: Any, env: dict[str, int]) -> tuple[int, int]:
        n = count(op.operands[0].type, env) if op.operands else 0
        return max(n, out_elems(op, env)) * per_input, read_all(op, env)

    return rule


def cost_add_norm(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """A residual add then RMS norm: an add, square, mean, rsqrt and two multiplies per element;
    every operand read once."""
    return 5 * count(op.operands[0].type, env), read_all(op, env)


def cost_gated_matmul(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """Two projections of x through [inter, hidden] matrices: 2 * 2 * tokens * inter * hidden."""
    x, wg = op.operands[0].type, op.operands[1].type
    tokens = count(x, env) // max(dim(x, -1, env, 1), 1)
    return 2 * 2 * tokens * count(wg, env), read_all(op, env)
