"""Element-level SMT encodings of the target ops (`ort.*`, `triton.*`): each is the encoding of
the `llm`/`core` op it implements, so a lowering and the op it replaced meet as equal terms.
Declarations name them with `smt=lazy("llmir_core.dialects.target_smt:NAME")`.

Imports z3 at the top (through the encodings it reuses): only the solver child and tests import
this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmir_core.smt.semantics import EncodeError, Encoder, STensor

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
    if not isinstance(n, int):
        raise EncodeError('epilogue "swiglu" over a symbolic N is not encoded')
    g, u = core_smt.split(enc, [y], {"axis": -1, "sizes": (n // 2, n // 2)})
    return llm_smt.silu_mul(enc, [g, u], {})


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


def ort_matmul_nbits(enc: Encoder, args: Args, attrs: At) -> STensor:
    """a @ b^T for a float b stored losslessly; a packed or requantized b is not encoded."""
    if len(args) > 2 or attrs["quantize"] != "none":
        raise EncodeError("matmul_nbits over packed or requantized blocks is not encoded")
    return _epilogue(enc, enc.matmul(args[0], args[1], transpose_b=True), attrs)


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
    """concat(past, new, axis=2); int8 storage (a scale per row of D values) is not encoded."""
    if attrs["cache_dtype"] == "i8":
        raise EncodeError("an int8 KV cache (codes and per-row scales) is not encoded")
    return enc.concat(args, 2)


def triton_attention(enc: Encoder, args: Args, attrs: At) -> STensor:
    keys = ("causal", "scale", "softcap", "sliding_window")
    return llm_smt.scaled_dot_product_attention(enc, args, {k: attrs[k] for k in keys})


def triton_argmax(enc: Encoder, args: Args, attrs: At) -> STensor:
    return core_smt.argmax(enc, args, {"axis": -1, "keepdims": False, "select_last_index": False})
