"""Rules of the approximate passes quantize-weights and kv-cache-int8.

They are tagged `approximate`: the rewritten value is not equal to the original, and what is
proved is the per-element error-bound lemma of the quantizer the pass uses (integer codes,
any rounding to nearest): symmetric codes in [-L, L] with s = amax / L give |x - q*s| <= s/2
and never clamp; asymmetric codes in [0, 2^bits - 1] with an integer zero point give
|x - (q - z)*s| <= s/2. Translation validation adds each logged instance `lhs == rhs` (the
matmul over the float weight equals the quantized matmul over the codes the pass wrote), so it
checks the rewritten structure and trusts the instance's error bound, which is this lemma.
"""

from __future__ import annotations

from typing import Any

from llmir_core.ir.types import DType

from .library import rule
from .proof_obligations import asym_quant_bound, sym_quant_bound
from .rule import Rule
from .terms import K, T, V, t

BITS = (4, 8)


def levels(bits: int, symmetric: bool) -> int:
    """The largest code magnitude: 2^(bits-1) - 1 (symmetric), 2^bits - 1 (asymmetric)."""
    return (1 << (bits - 1)) - 1 if symmetric else (1 << bits) - 1


def _q_leaves(prefix: str, symmetric: bool) -> tuple[Any, ...]:
    return (V(f"{prefix}q"), V(f"{prefix}s")) + (() if symmetric else (V(f"{prefix}z"),))


def _qmm(x: Any, prefix: str, symmetric: bool) -> T:
    return T("llm.quantized_matmul", (x,) + _q_leaves(prefix, symmetric), {"transpose_b": True})


def weight_rule_name(bits: int, symmetric: bool, consumer: str) -> str:
    return f"quantize-weights-int{bits}-{'sym' if symmetric else 'asym'}-{consumer}"


def _obligation(bits: int, symmetric: bool) -> Any:
    n = levels(bits, symmetric)
    return sym_quant_bound(n) if symmetric else asym_quant_bound(n)


for _bits in BITS:
    for _sym in (True, False):
        _kind = f"int{_bits} {'symmetric' if _sym else 'asymmetric'}"
        for _tb in (True, False):
            _lhs = t("core.matmul", V("x"), V("w"), transpose_a=False, transpose_b=_tb)
            rule(
                Rule(
                    name=weight_rule_name(_bits, _sym, "matmul" if _tb else "matmul-kn"),
                    summary=f"x @ w{'^T' if _tb else ''} ~ quantized_matmul over {_kind} blockwise codes of w"
                    f"{'' if _tb else '^T'} (|error| <= scale/2 per weight)",
                    lhs=_lhs,
                    rhs=_qmm(V("x"), "w", _sym),
                    sig={"x": "... m k", "w": "n k" if _tb else "k n"},
                    tag="approximate",
                    obligation=_obligation(_bits, _sym),
                    passes=("quantize-weights",),
                )
            )
        for _act in ("silu", "gelu", "gelu_tanh"):
            _g, _u = _qmm(V("x"), "g", _sym), _qmm(V("x"), "u", _sym)
            if _act == "silu":
                _h: T = t("llm.silu_mul", _g, _u)
            else:
                _h = t(
                    "core.mul",
                    t("core.gelu", _g, approximate="none" if _act == "gelu" else "tanh"),
                    _u,
                )
            rule(
                Rule(
                    name=weight_rule_name(_bits, _sym, f"gated-mlp-{_act}"),
                    summary=f"a gated MLP ~ three quantized_matmuls over {_kind} blockwise codes of its weights",
                    lhs=t("llm.gated_mlp", V("x"), V("wg"), V("wu"), V("wd"), activation=_act),
                    rhs=_qmm(_h, "d", _sym),
                    sig={"x": "... s h", "wg": "f h", "wu": "f h", "wd": "h f"},
                    tag="approximate",
                    obligation=_obligation(_bits, _sym),
                    passes=("quantize-weights",),
                )
            )


# -- KV cache int8: one scale per (batch, head, position), over the head_dim channels -------------

KV_LEVELS = 127


def kv_scale(x: Any) -> T:
    """s = max|x| / 127 over the last axis (head_dim), 1 where that row is all zeros."""
    amax = t("core.reduce_max", t("core.abs", x), axes=(-1,), keepdims=True)
    return t(
        "core.where",
        t("core.equal", amax, K(0.0)),
        K(1.0),
        t("core.div", amax, K(float(KV_LEVELS))),
    )


def kv_codes(x: Any, scale: Any) -> T:
    """The int8 codes round(x / s) (in [-127, 127] by the error-bound lemma)."""
    return t("core.cast", t("core.round", t("core.div", x, scale)), to=DType.i8)


def kv_dequant(codes: Any, scale: Any) -> T:
    return t("core.mul", t("core.cast", codes, to=DType.f32), scale)


KV_CODE_MIN, KV_CODE_MAX = -128, 127


def kv_codes_static(x: Any, scale: Any, inverse: Any = None) -> T:
    """int8 codes of x against a static (calibrated) scale, as onnxruntime's GroupQueryAttention
    stores them (checked by experiment on its CPU kernel): x * (1/s) in f32, rounded half to
    even, saturated to [-128, 127]. `inverse`: the pattern of 1/s once constant-folded."""
    inv = t("core.div", K(1.0), scale) if inverse is None else inverse
    r = t("core.round", t("core.mul", x, inv))
    clipped = t("core.max", t("core.min", r, K(float(KV_CODE_MAX))), K(float(KV_CODE_MIN)))
    return t("core.cast", clipped, to=DType.i8)


_S = kv_scale(V("new"))
rule(
    Rule(
        name="kv-cache-int8",
        summary="a cache entry concat(past, new) ~ concat(past, f32(int8 codes of new) * scale), one scale "
        "per batch row, head and position (|error| <= scale/2 per element)",
        lhs=t("core.concat", V("past"), V("new"), axis=2),
        rhs=t("core.concat", V("past"), kv_dequant(kv_codes(V("new"), _S), _S), axis=2),
        sig={"past": "b h p d", "new": "b h s d"},
        tag="approximate",
        obligation=sym_quant_bound(KV_LEVELS),
        passes=("kv-cache-int8",),
    )
)
