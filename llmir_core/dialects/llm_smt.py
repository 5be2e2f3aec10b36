"""Element-level SMT encodings of the `llm` ops (each declaration names its own with
`smt=lazy("llmir_core.dialects.llm_smt:NAME")`).

Each fused op is encoded as its definition, built from the encoder's shared helpers and the core
encodings, so a pattern and its fused op meet as equal hash-consed terms wherever a rule is
exact. Imports z3 at the top: only the solver child and tests import this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import z3

from llmir_core.smt.semantics import EncodeError, Encoder, STensor, zero_at

Idx = tuple[Any, ...]
Args = Sequence[STensor]
At = dict[str, Any]


def rms_norm(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.rms_norm(args[0], args[1], attrs.get("eps", 1e-6), attrs.get("offset", 0.0))


def add_rms_norm(enc: Encoder, args: Args, attrs: At) -> list[STensor]:
    x, r, w = args
    s = enc.elementwise(lambda a, b: a + b, x, r)
    return [rms_norm(enc, [s, w], attrs), s]


def layer_norm(enc: Encoder, args: Args, attrs: At) -> STensor:
    x, w = args[0], args[1]
    eps = attrs.get("eps", 1e-5)
    eps = z3.RealVal(eps) if isinstance(eps, float) else eps
    mean = enc.reduce(x, (-1,), True, "mean")
    c = enc.elementwise(lambda a, b: a - b, x, mean)
    var = enc.reduce(enc.elementwise(lambda a, b: a * b, c, c), (-1,), True, "mean")
    last = x.rank - 1
    y = STensor(x.shape, lambda i: c.f(i) * enc.rsqrt(var.f(zero_at(i, last)) + eps))
    y = enc.elementwise(lambda a, b: a * b, y, w)
    if len(args) > 2:
        y = enc.elementwise(lambda a, b: a + b, y, args[2])
    return y


def silu_mul(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.elementwise(lambda g, u: enc.silu(g) * u, args[0], args[1])


def gated_mlp(enc: Encoder, args: Args, attrs: At) -> STensor:
    x, wg, wu, wd = args
    act = attrs.get("activation", "silu")
    g = enc.matmul(x, wg, transpose_b=True)
    u = enc.matmul(x, wu, transpose_b=True)
    if act == "silu":
        h = silu_mul(enc, [g, u], {})
    else:
        ga = enc.gelu(g, "tanh" if act == "gelu_tanh" else "none")
        h = enc.elementwise(lambda p, q: p * q, ga, u)
    return enc.matmul(h, wd, transpose_b=True)


def linear(enc: Encoder, args: Args, attrs: At) -> STensor:
    y = enc.matmul(args[0], args[1], transpose_b=attrs.get("transpose_b", True))
    if len(args) > 2:
        y = enc.elementwise(lambda a, b: a + b, y, args[2])
    return enc.activation(attrs.get("activation", "none"), y)


def embedding(enc: Encoder, args: Args, attrs: At) -> STensor:
    table, ids = args
    n = ids.rank
    return STensor(
        tuple(ids.shape) + tuple(table.shape[1:]),
        lambda i: table.f((enc.as_int(ids.f(i[:n])),) + tuple(i[n:])),
    )


def rotary_embedding(enc: Encoder, args: Args, attrs: At) -> STensor:
    """x [B, H, S, D] rotated by the cos/sin rows [max_pos, D/2] at positions [B, S] (the
    non-interleaved, full-width form)."""
    x, cos, sin, pos = args
    if attrs.get("interleaved") or attrs.get("rotary_dim", 0):
        raise EncodeError("only full, non-interleaved rotary embedding is encoded")
    half = cos.shape[1]

    def p(i: Idx) -> Any:
        return enc.as_int(pos.f((i[0], i[2])))

    def f(i: Idx) -> Any:
        d = i[3]
        lo = i[:3] + (d + half,)
        hi = i[:3] + (d - half,)
        first = x.f(i) * cos.f((p(i), d)) - x.f(lo) * sin.f((p(i), d))
        second = x.f(i) * cos.f((p(i), d - half)) + x.f(hi) * sin.f((p(i), d - half))
        return z3.If(d < half, first, second)

    return STensor(x.shape, f)


def scaled_dot_product_attention(enc: Encoder, args: Args, attrs: At) -> STensor:
    q, k, v = args[:3]
    for key in ("softcap", "sliding_window", "softmax_eps"):
        if attrs.get(key):
            raise EncodeError(f"attention with {key} is not encoded")
    scale = attrs.get("scale", 0.0)
    if isinstance(scale, float):
        if scale == 0.0:
            raise EncodeError("attention with the default scale is not encoded")
        scale = z3.RealVal(scale)
    group = quotient(q.shape[1], k.shape[1])
    if group is not None:  # grouped-query: kv head h // group serves q head h
        k = STensor(
            k.shape[:1] + q.shape[1:2] + k.shape[2:],
            (lambda t: lambda i: t.f((i[0], i[1] / group) + i[2:]))(k),
        )
        v = STensor(
            v.shape[:1] + q.shape[1:2] + v.shape[2:],
            (lambda t: lambda i: t.f((i[0], i[1] / group) + i[2:]))(v),
        )
    s = enc.matmul(q, enc.transpose(k, (0, 1, 3, 2)))
    s = enc.elementwise(lambda a, b: a * b, s, STensor((), lambda i: scale))
    if len(args) > 3:
        s = enc.op("core.add", [s, args[3]], {})[0]
    if attrs.get("causal"):
        sq, skv = q.shape[2], k.shape[2]
        sc = s
        # masked iff key j > i + Skv - Sq (the same normal form as an additive trilu mask)
        s = STensor(sc.shape, lambda i: z3.If(i[3] - i[2] >= 1 + skv - sq, enc.neg_inf, sc.f(i)))
    return enc.matmul(enc.softmax(s, -1), v)


def quotient(a: Any, b: Any) -> Any:
    """a / b for head counts (None when equal): ints, or a product of symbols with b a factor."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0 or a % b:
            raise EncodeError(f"{a} heads are not a multiple of {b}")
        return None if a == b else a // b
    if not isinstance(a, int) and not isinstance(b, int) and a.eq(b):
        return None
    if z3.is_mul(a):
        rest = [a.arg(i) for i in range(a.num_args())]
        for j, f in enumerate(rest):
            if not isinstance(b, int) and f.eq(b):
                others = rest[:j] + rest[j + 1 :]
                out = others[0]
                for o in others[1:]:
                    out = out * o
                return out
    raise EncodeError("cannot tell the grouped-query factor from the head counts")
