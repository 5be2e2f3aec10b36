"""Interval arithmetic and cost helpers for op declarations (`OpDef.interval`, `OpDef.cost`):
sound bounds [lo, hi] on a result from its operands' bounds, and FLOP counts. Pure Python, so
dialect modules can use them; `llmir_core.smt.intervals` propagates them through a module."""

from __future__ import annotations

import math
from typing import Any

from llmir_core.ir.dims import SymDim, eval_dim
from llmir_core.ir.types import TensorType

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
