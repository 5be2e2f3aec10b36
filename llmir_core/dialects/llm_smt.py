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

from llmir_core.smt.semantics import (
    CodesTensor,
    EncodeError,
    Encoder,
    STensor,
    bit_field,
    clamp_int,
    round_half_away,
    zero_at,
)

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
    """x [B, H, S, D] rotated by the cos/sin rows [max_pos, R/2] at positions [B, S], over its
    first R = rotary_dim (0: all D) channels, the rest passed through. Pair i is channels
    (i, i + R/2) (non-interleaved) or (2i, 2i + 1) (interleaved): (x1, x2) -> (c x1 - s x2,
    s x1 + c x2)."""
    x, cos, sin, pos = args
    half = cos.shape[1]
    rd = attrs.get("rotary_dim", 0) or x.shape[3]
    partial = bool(attrs.get("rotary_dim", 0))
    inter = bool(attrs.get("interleaved"))

    def p(i: Idx) -> Any:
        return enc.as_int(pos.f((i[0], i[2])))

    def at(i: Idx, d: Any) -> Any:
        return x.f(i[:3] + (d,))

    def f(i: Idx) -> Any:
        d = i[3]
        if inter:
            j = d / 2  # the pair (2j, 2j + 1): integer division of a z3 Int
            c, s = cos.f((p(i), j)), sin.f((p(i), j))
            even = at(i, d) * c - at(i, d + 1) * s
            odd = s * at(i, d - 1) + c * at(i, d)
            out = z3.If(d % 2 == 0, even, odd)
        else:
            first = at(i, d) * cos.f((p(i), d)) - at(i, d + half) * sin.f((p(i), d))
            second = at(i, d) * cos.f((p(i), d - half)) + at(i, d - half) * sin.f((p(i), d - half))
            out = z3.If(d < half, first, second)
        return z3.If(d < rd, out, x.f(i)) if partial else out

    return STensor(x.shape, f)


def scaled_dot_product_attention(enc: Encoder, args: Args, attrs: At) -> STensor:
    """softmax(cap(q k^T * scale) + mask, masked keys at -inf) v, the softmax's denominator plus
    softmax_eps; cap is softcap * tanh(s / softcap); causal (or a sliding window W) masks key j of
    query i where j > p (or j <= p - W), p = i + Skv - Sq."""
    q, k, v = args[:3]
    scale = attrs.get("scale", 0.0)
    if isinstance(scale, float):
        # the default scale is 1/sqrt(head_dim): rsqrt of the dim, with its defining lemma
        scale = enc.rsqrt(enc.real_dim(q.shape[-1])) if scale == 0.0 else z3.RealVal(scale)
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
    cap = attrs.get("softcap", 0.0)
    if cap:
        c = z3.RealVal(cap)
        s = enc.elementwise(lambda a: c * enc.uf("tanh")(a / c), s)
    if len(args) > 3:
        s = enc.op("core.add", [s, args[3]], {})[0]
    window = attrs.get("sliding_window", 0)
    if attrs.get("causal") or window:
        sq, skv = q.shape[2], k.shape[2]
        sc = s

        def masked(i: Idx) -> Any:
            # key j > i + Skv - Sq (the same normal form as an additive trilu mask)
            late = i[3] - i[2] >= 1 + skv - sq
            if not window:
                return late
            return z3.Or(late, i[3] - i[2] <= skv - sq - window)

        s = STensor(sc.shape, lambda i: z3.If(masked(i), enc.neg_inf, sc.f(i)))
    eps = attrs.get("softmax_eps", 0.0)
    if not eps:
        return enc.matmul(enc.softmax(s, -1), v)
    mx = enc.reduce(s, (-1,), True, "max")
    e = STensor(s.shape, lambda i: enc.exp(s.f(i) - mx.f(zero_at(i, 3))))
    tot = enc.reduce(e, (-1,), True, "sum")
    p = STensor(s.shape, lambda i: e.f(i) / (tot.f(zero_at(i, 3)) + z3.RealVal(eps)))
    return enc.matmul(p, v)


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


# -- quantized storage: the nbits layout (llmir_core/quant/nbits.py) ------------------------------
#
# A value of an `!quant<nbits, bits, block, ...>` type is encoded by its codes: element [.., n, k]
# is the unsigned code (an integer in [0, 2^bits)) of logical element k of row n. Zero points are
# what the IR holds: u8 bytes [.., N, ceil(K/block * bits / 8)], 8/bits codes a byte, lowest bits
# first; a code is read out of its byte by integer arithmetic (semantics.bit_field). Scales are
# their values (an f16 scale is the f16 value). Block of element k: k div block.


def _nbits(q: Any, what: str) -> Any:
    if q is None:
        raise EncodeError(f"{what}: the packed operand's format is unknown here (no __qtype__)")
    if getattr(q, "scheme", None) != "nbits":
        fmt = getattr(q, "scheme", q)
        raise EncodeError(
            f"{what} of {fmt} blocks is not encoded: only the nbits layout (codes, per-block "
            "scales, packed zero points) is; GGUF and checkpoint formats pack scales and "
            "minimums into their blocks' bit fields"
        )
    return q


def nbits_zero(enc: Encoder, q: Any, zp: STensor | None, lead: Idx, blk: Any) -> Any:
    """Block `blk`'s zero point of row `lead`: the midpoint 2^(bits-1) (symmetric) or its code in
    the packed zero-point bytes."""
    if zp is None:
        return z3.IntVal(1 << (q.bits - 1))
    per = 8 // q.bits
    byte = enc.as_int(zp.f(lead + (blk / per if per > 1 else blk,)))
    return bit_field(byte, blk % per if per > 1 else 0, q.bits)


def nbits_values(enc: Encoder, q: Any, args: Args) -> STensor:
    """The logical values (code - zero) * scale of nbits data [codes, scales(, zero points)]."""
    codes, scales = args[0], args[1]
    zp = args[2] if len(args) > 2 else None
    if (zp is None) != (q.zero == "none"):
        raise EncodeError("nbits data with zero=int needs its zero points (and only then)")

    def f(i: Idx) -> Any:
        lead, k = i[:-1], i[-1]
        blk = k / q.block
        z = nbits_zero(enc, q, zp, lead, blk)
        return enc.as_real(enc.as_int(codes.f(i)) - z) * scales.f(lead + (blk,))

    return STensor(codes.shape, f)


def qtype_of(packed: STensor, attrs: At) -> Any:
    """The QuantType of packed data: carried by a CodesTensor, else the `__qtype__` hint."""
    q = packed.qtype if isinstance(packed, CodesTensor) else None
    return q if q is not None else attrs.get("__qtype__")


def dequantize(enc: Encoder, args: Args, attrs: At) -> STensor:
    q = _nbits(qtype_of(args[0], attrs), "dequantize")
    return nbits_values(enc, q, args)


def quantized_matmul(enc: Encoder, args: Args, attrs: At) -> STensor:
    q = _nbits(qtype_of(args[1], attrs), "quantized_matmul")
    w = nbits_values(enc, q, args[1:])
    return enc.matmul(args[0], w, transpose_b=attrs.get("transpose_b", True))


def quantize(enc: Encoder, args: Args, attrs: At) -> list[STensor]:
    """MLAS' quantizer over each block of `block` values along the last dim (in f32: each f32
    (f16) rounding is the uninterpreted `round_f32` (`round_f16`), roundf is round half away):
    symmetric: s = m / -2^(bits-1), m the block's value of largest magnitude (min on ties), zero
    2^(bits-1); asymmetric: lo = min(min, 0), hi = max(max, 0), s = (hi - lo) / (2^bits - 1),
    zero = clamp(roundf(-lo / s)); code = clamp(roundf(x * (1 / s) + zero), 0, 2^bits - 1)."""
    q = _nbits(attrs["format"], "quantize")
    x = args[0]
    top = (1 << q.bits) - 1
    f32 = enc.uf("round_f32")
    narrow = enc.uf("round_f16") if str(q.scale) == "f16" else None
    k_dim = x.shape[-1]
    nb = k_dim // q.block if isinstance(k_dim, int) else k_dim / q.block
    lead_shape = tuple(x.shape[:-1])

    def block_vals(lead: Idx, blk: Any) -> Any:
        return lambda j: x.f(lead + (blk * q.block + j,))

    def s32(lead: Idx, blk: Any) -> Any:
        lo = enc.reduction("min", q.block, block_vals(lead, blk))
        hi = enc.reduction("max", q.block, block_vals(lead, blk))
        if q.zero == "none":
            m = z3.If(z3.Abs(hi) > z3.Abs(lo), hi, lo)
            return f32(m / -(1 << (q.bits - 1)))
        lo0, hi0 = z3.If(lo < 0, lo, 0), z3.If(hi > 0, hi, 0)
        return f32(f32(hi0 - lo0) / top), lo0

    def scale(lead: Idx, blk: Any) -> Any:
        s = s32(lead, blk)
        s = s[0] if isinstance(s, tuple) else s
        return narrow(s) if narrow is not None else s

    def zero(lead: Idx, blk: Any) -> Any:
        if q.zero == "none":
            return z3.IntVal(1 << (q.bits - 1))
        s, lo0 = s32(lead, blk)
        zf = z3.If(s != 0, f32(0 - lo0 / s), lo0)
        return clamp_int(round_half_away(zf), 0, top)

    def code(i: Idx) -> Any:
        lead, k = i[:-1], i[-1]
        blk = k / q.block
        s = scale(lead, blk)
        inv = z3.If(s != 0, f32(1 / s), 0)
        t = f32(f32(x.f(i) * inv) + enc.as_real(zero(lead, blk)))
        return enc.as_real(clamp_int(round_half_away(t), 0, top))

    outs: list[STensor] = [
        CodesTensor(tuple(x.shape), code, qtype=q),
        STensor(lead_shape + (nb,), lambda i: scale(i[:-1], i[-1])),
    ]
    if q.zero != "none":
        per = 8 // q.bits

        def zbyte(i: Idx) -> Any:
            lead, j = i[:-1], i[-1]
            out: Any = z3.IntVal(0)
            for slot in range(per):
                blk = j * per + slot
                z = z3.If(blk < nb, zero(lead, blk), z3.IntVal(1 << (q.bits - 1)))
                out = out + z * (1 << (q.bits * slot))
            return enc.as_real(out)

        zb = (nb * q.bits + 7) // 8 if isinstance(nb, int) else (nb * q.bits + 7) / 8
        outs.append(STensor(lead_shape + (zb,), zbyte))
    return outs
