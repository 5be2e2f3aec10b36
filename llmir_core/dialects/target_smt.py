"""Element-level SMT encodings of the target ops (`ort.*`, `triton.*`): each is the encoding of
the `llm`/`core` op it implements, so a lowering and the op it replaced meet as equal terms.
Declarations name them with `smt=lazy("llmir_core.dialects.target_smt:NAME")`.

Imports z3 at the top (through the encodings it reuses): only the solver child and tests import
this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import z3

from llmir_core.smt.semantics import Encoder, STensor, clamp_int, round_half_even, zero_at

from . import core_smt, llm_smt

Args = Sequence[STensor]
At = dict[str, Any]


def _rms(at: At) -> At:
    return {"eps": at["epsilon"], "offset": at["offset"]}


# -- onnxruntime ---------------------------------------------------------------------------------


def ort_simplified_layer_norm(enc: Encoder, args: Args, attrs: At) -> STensor:
    return llm_smt.rms_norm(enc, args, _rms(attrs))


def ort_skip_simplified_layer_norm(enc: Encoder, args: Args, attrs: At) -> list[STensor]:
    return llm_smt.add_rms_norm(enc, args, _rms(attrs))


def ort_fused_matmul(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.matmul(args[0], args[1], transpose_b=bool(attrs["transB"]))


def _epilogue(enc: Encoder, y: STensor, attrs: At) -> STensor:
    """The `epilogue` of llmir's matmuls: "swiglu" is silu(y[..., :H]) * y[..., H:]."""
    if attrs.get("epilogue", "none") != "swiglu":
        return y
    n = y.shape[-1]
    if isinstance(n, int):
        g, u = core_smt.split(enc, [y], {"axis": -1, "sizes": (n // 2, n // 2)})
        return llm_smt.silu_mul(enc, [g, u], {})
    h = n / 2  # a symbolic N = 2H: integer division of the z3 Int
    shape = tuple(y.shape[:-1]) + (h,)
    return STensor(shape, lambda i: enc.silu(y.f(i)) * y.f(i[:-1] + (i[-1] + h,)))


def ort_matmul16(enc: Encoder, args: Args, attrs: At) -> STensor:
    """a @ f32(b)^T: the widening encoded as ort.cast to f32 is (so the rewrite of
    ort.fused_matmul(a, ort.cast(b, f32)) meets it as an equal term), then the epilogue."""
    y = enc.matmul(args[0], core_smt.cast(enc, [args[1]], {"to": "f32"}), transpose_b=True)
    return _epilogue(enc, y, attrs)


def ort_matmul_f32(enc: Encoder, args: Args, attrs: At) -> STensor:
    return _epilogue(enc, enc.matmul(args[0], args[1], transpose_b=True), attrs)


def ort_quick_gelu(enc: Encoder, args: Args, attrs: At) -> STensor:
    """x * sigmoid(alpha * x); alpha 1 is SiLU (the same term as core.silu)."""
    alpha = attrs["alpha"]
    if alpha == 1.0:
        return core_smt.silu(enc, args, {})
    a = enc.as_real(float(alpha))
    return enc.elementwise(lambda x: x * enc.sigmoid(x * a), args[0])


def _requantized(enc: Encoder, w: STensor, attrs: At) -> list[STensor]:
    """llm.quantize of a float weight to the op's blocks (its decomposition's first step)."""
    from .ort import nbits_qtype

    q = nbits_qtype(
        attrs["bits"], attrs["block_size"], attrs["quantize"], attrs.get("scale_dtype", "f32")
    )
    return llm_smt.quantize(enc, [w], {"format": q})


def ort_matmul_nbits(enc: Encoder, args: Args, attrs: At) -> STensor:
    """As its decomposition: a @ b^T for a float b stored losslessly; over a packed b (codes,
    scales, zero points) or a float b rounded to blocks first (`quantize` sym/asym: MLAS'
    quantizer), llm.quantized_matmul; then the epilogue."""
    a, b = args[0], args[1]
    if len(args) > 2:
        y = llm_smt.quantized_matmul(enc, args, {**attrs, "transpose_b": True})
    elif attrs["quantize"] != "none":
        y = llm_smt.quantized_matmul(enc, [a, *_requantized(enc, b, attrs)], {"transpose_b": True})
    else:
        y = enc.matmul(a, b, transpose_b=True)
    return _epilogue(enc, y, attrs)


def ort_matmul_gguf(enc: Encoder, args: Args, attrs: At) -> STensor:
    """a @ b^T: b is the exact dequantized GGUF weight (the op does not round it); then the
    epilogue."""
    return _epilogue(enc, enc.matmul(args[0], args[1], transpose_b=True), attrs)


def ort_gather_block_quantized(enc: Encoder, args: Args, attrs: At) -> STensor:
    """Rows of the table as stored: rounded to blocks along its rows first (`quantize` sym)."""
    table, ids = args
    if attrs["quantize"] != "none":
        parts = _requantized(enc, table, {**attrs, "quantize": "sym"})
        table = llm_smt.nbits_values(enc, parts[0].qtype, parts)  # type: ignore[attr-defined]
    return llm_smt.embedding(enc, [table, ids], {})


# -- triton --------------------------------------------------------------------------------------


def triton_embedding(enc: Encoder, args: Args, attrs: At) -> STensor:
    return llm_smt.embedding(enc, args, {})


def triton_rms_norm(enc: Encoder, args: Args, attrs: At) -> STensor:
    return llm_smt.rms_norm(enc, args, attrs)


def triton_add_rms_norm(enc: Encoder, args: Args, attrs: At) -> list[STensor]:
    return llm_smt.add_rms_norm(enc, args, attrs)


def triton_rotary(enc: Encoder, args: Args, attrs: At) -> STensor:
    return llm_smt.rotary_embedding(enc, args, attrs)


def triton_matmul(enc: Encoder, args: Args, attrs: At) -> STensor:
    return llm_smt.linear(enc, args, {"activation": attrs["activation"], "transpose_b": True})


def triton_gated_matmul(enc: Encoder, args: Args, attrs: At) -> STensor:
    """act(x @ w_gate^T) * (x @ w_up^T): the first half of llm.gated_mlp."""
    x, wg, wu = args
    g = enc.matmul(x, wg, transpose_b=True)
    u = enc.matmul(x, wu, transpose_b=True)
    act = attrs["activation"]
    if act == "silu":
        return llm_smt.silu_mul(enc, [g, u], {})
    ga = enc.gelu(g, "tanh" if act == "gelu_tanh" else "none")
    return enc.elementwise(lambda p, q: p * q, ga, u)


def triton_kv_append(enc: Encoder, args: Args, attrs: At) -> STensor:
    """concat(past, new, axis=2); cache_dtype i8 stores each new row of D values as int8 codes
    rint(x / s) with s = max|row| / 127 (1 for an all-zero row) and reads back codes * s."""
    past, new = args
    if attrs["cache_dtype"] == "i8":
        new = int8_rows(enc, new)
    return enc.concat([past, new], 2)


def int8_rows(enc: Encoder, x: STensor) -> STensor:
    """x rounded to int8 per row of its last axis: rint(x / s) * s, s = max|row| / 127 (or 1)."""
    last = x.rank - 1
    amax = enc.reduce(STensor(x.shape, lambda i: z3.Abs(x.f(i))), (-1,), True, "max")

    def f(i: Any) -> Any:
        m = amax.f(zero_at(i, last))
        s = z3.If(m == 0, z3.RealVal(1), m / 127)
        return z3.ToReal(round_half_even(x.f(i) / s)) * s

    return STensor(x.shape, f)


def triton_q_matmul(enc: Encoder, args: Args, attrs: At) -> STensor:
    """x @ dequantize(w)^T over nbits codes (GGUF q8_0/q4_0 blocks: not encoded, see
    llm_smt.dequantize)."""
    return llm_smt.quantized_matmul(enc, args, {**attrs, "transpose_b": True})


def triton_attention(enc: Encoder, args: Args, attrs: At) -> STensor:
    keys = ("causal", "scale", "softcap", "sliding_window")
    return llm_smt.scaled_dot_product_attention(enc, args, {k: attrs[k] for k in keys})


def triton_argmax(enc: Encoder, args: Args, attrs: At) -> STensor:
    return core_smt.argmax(enc, args, {"axis": -1, "keepdims": False, "select_last_index": False})


# -- llmir's int8 matmul (llmir_core/quant/s8.py) -------------------------------------------------

S8_BLOCK, S8_GEMV_ROWS = 32, 4


def _s8_weight(enc: Encoder, w: STensor) -> STensor:
    """w [N, K] as the kernel stores it: codes clamp(rint(w / s), -127, 127) times the row's f32
    scale s = max|row| / 127 (1 for a zero row)."""
    f32 = enc.uf("round_f32")
    amax = enc.reduce(STensor(w.shape, lambda i: z3.Abs(w.f(i))), (-1,), True, "max")

    def f(i: Any) -> Any:
        s0 = f32(amax.f((i[0], 0)) / 127)
        s = z3.If(s0 > 0, s0, z3.RealVal(1))
        q = clamp_int(round_half_even(f32(w.f(i) / s)), -127, 127)
        return z3.ToReal(q) * s

    return STensor(w.shape, f)


def _s8_rows(enc: Encoder, x: STensor) -> STensor:
    """The activations as the kernel rounds them per block of 32 columns (columns past K count
    as 0): with at most 4 rows (M = the product of the leading dims), int8 codes
    rint(x * f32(127 / amax)) times amax / 127; with more, 7-bit codes with a zero point over
    [min(block, 0), max(block, 0)]."""
    f32 = enc.uf("round_f32")
    k_dim = x.shape[-1]
    rows: Any = 1
    for d in x.shape[:-1]:
        rows = rows * d

    def block(i: Any, kind: str) -> Any:
        b0 = (i[-1] / S8_BLOCK) * S8_BLOCK

        def val(j: Any) -> Any:
            c = b0 + j
            return z3.If(c < k_dim, x.f(tuple(i[:-1]) + (c,)), z3.RealVal(0))

        if kind == "amax":
            return enc.reduction("max", S8_BLOCK, lambda j: z3.Abs(val(j)))
        return enc.reduction(kind, S8_BLOCK, val)

    def gemv(i: Any) -> Any:
        amax = block(i, "amax")
        inv = z3.If(amax > 0, f32(127 / amax), z3.RealVal(0))
        q = round_half_even(f32(x.f(i) * inv))
        return z3.ToReal(q) * f32(amax / 127)

    def prefill(i: Any) -> Any:
        lo0, hi0 = block(i, "min"), block(i, "max")
        lo = z3.If(lo0 < 0, lo0, z3.RealVal(0))
        hi = z3.If(hi0 > 0, hi0, z3.RealVal(0))
        span = f32(hi - lo)
        live = span > 0
        inv = z3.If(live, f32(127 / span), z3.RealVal(0))
        z = clamp_int(round_half_even(f32(-lo * inv)), 0, 127)
        q = clamp_int(round_half_even(f32(x.f(i) * inv)) + z, 0, 127)
        return z3.If(live, z3.ToReal(q - z) * f32(span / 127), z3.RealVal(0))

    if isinstance(rows, int):
        return STensor(x.shape, gemv if rows <= S8_GEMV_ROWS else prefill)
    return STensor(x.shape, lambda i: z3.If(rows <= S8_GEMV_ROWS, gemv(i), prefill(i)))


def ort_matmul_s8(enc: Encoder, args: Args, attrs: At) -> STensor:
    """a @ b^T with b rounded to int8 per output channel and a per 32 columns at run time (the
    integer block sums scaled back equal the product of the dequantized values), then the
    epilogue."""
    a, b = args
    y = enc.matmul(_s8_rows(enc, a), _s8_weight(enc, b), transpose_b=True)
    return _epilogue(enc, y, attrs)
