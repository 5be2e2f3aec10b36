"""Element-level SMT encodings of the `triton.*` ops: each is the encoding of the `llm`/`core`
op it implements, so a lowering and the op it replaced meet as equal terms. Declarations name
them with `smt=lazy("llmir_core.targets.triton.smt:NAME")`.

Imports z3 at the top (through the encodings it reuses): only the solver child and tests import
this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import z3

from llmir_core.dialects import core_smt, llm_smt
from llmir_core.smt.semantics import Encoder, STensor, round_half_even, zero_at

Args = Sequence[STensor]
At = dict[str, Any]


def _rms(at: At) -> At:
    return {"eps": at["epsilon"], "offset": at["offset"]}


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
