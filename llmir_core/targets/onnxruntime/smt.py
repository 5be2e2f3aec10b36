"""Element-level SMT encodings of the `ort.*` ops: each is the encoding of
the `llm`/`core` op it implements, so a lowering and the op it replaced meet as equal terms.
Declarations name them with `smt=lazy("llmir_core.targets.onnxruntime.smt:NAME")`.

Imports z3 at the top (through the encodings it reuses): only the solver child and tests import
this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import z3

from llmir_core.dialects import core_smt, llm_smt
from llmir_core.smt.semantics import Encoder, STensor, clamp_int, round_half_even

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
    from llmir_core.targets.onnxruntime.dialect import nbits_qtype

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


# -- weight packing (ort.pack) ----------------------------------------------------------------------


def ort_pack(enc: Encoder, args: Args, attrs: At) -> STensor:
    """The stored weight's value: w (a lossless format), or w rounded to the nbits blocks
    (llm.quantize's codes and scales read back: the term a requantizing matmul reads)."""
    w = args[0]
    if attrs["format"] != "nbits" or attrs["quantize"] == "none":
        return w
    parts = _requantized(enc, w, attrs)
    return llm_smt.nbits_values(enc, parts[0].qtype, parts)  # type: ignore[attr-defined]
