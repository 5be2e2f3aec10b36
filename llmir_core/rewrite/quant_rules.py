"""Rules of the approximate passes quantize-weights and kv-cache-int8.

They are tagged `approximate` and state an `ErrorBound` proved about their own terms
(`llmir_core.smt.prove_approx`):

- `quantize-weights-*-matmul[-kn]`: `matmul(x, w) ~ quantized_matmul(x, q, s[, z])`. Premise
  (over the leaves): every weight is within half a step of its dequantized code,
  `|(q - z) s - w| <= |s| / 2` per element, s the scale of its block (`numeric_check` checks it
  on the concrete codes, translation validation calls it). Bound:
  `|rhs - lhs| <= 0.5 * sum_k |x_k| * max_g |s[n, g]|` (the magnitude term).
- `quantize-weights-*-gated-mlp-*`: stated, not proved (the nested reductions through the
  activation have no per-term bound here): reported `unproved`, applied only with
  `--allow-unproved`.
- `kv-cache-int8`: the new entries become int8 codes times a per-row scale: `|rhs - lhs| <=
  0.5 * scale` per element (0 on the past entries), proved with `round` an integer within 1/2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.ir.types import DType

from .bounds import ErrorBound, no_bound
from .library import rule
from .rule import Rule
from .terms import K, T, Term, V, t

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


def weight_premise(leaf: str, prefix: str, transposed: bool) -> Any:
    """(solver child) the weight leaf is its dequantized codes plus an error within |s|/2:
    w = (q - z) s + delta, |delta| <= |s[n, block(k)]| / 2 (codes [n, k], scales [n, g])."""

    def premise(enc: Any, ts: dict[str, Any], dims: dict[str, Any]) -> dict[str, Any]:
        import z3

        from llmir_core.smt.semantics import STensor

        q, sc = ts[f"{prefix}q"], ts[f"{prefix}s"]
        deq = enc.dequant(q, sc, ts.get(f"{prefix}z"))
        blk = enc.block_of(sc.shape[1])
        delta = z3.Function(f"delta_{leaf}", z3.IntSort(), z3.IntSort(), z3.RealSort())

        def radius(app: Any) -> list[Any]:
            s_ = sc.f((app.arg(0), blk(app.arg(1))))
            return [z3.If(app >= 0, app, -app) <= z3.If(s_ >= 0, s_, -s_) / 2]

        enc.app_lemma[f"delta_{leaf}"] = radius
        if transposed:  # w is [k, n]: the codes are of w^T
            return {
                leaf: STensor(
                    (q.shape[1], q.shape[0]), lambda i: deq.f((i[1], i[0])) + delta(i[1], i[0])
                )
            }
        return {leaf: STensor(q.shape, lambda i: deq.f(i) + delta(*i))}

    return premise


def weight_check(leaf: str, prefix: str, transposed: bool) -> Any:
    """The premise on concrete arrays: codes (a packed nbits array), scales, zero points and the
    float weight. None when every weight is within half a step of its dequantized code."""

    def check(arrays: dict[str, Any]) -> str | None:
        from llmir_core.quant import dequantize
        from llmir_core.weights import PackedArray

        q, sc = arrays.get(f"{prefix}q"), arrays.get(f"{prefix}s")
        if not isinstance(q, PackedArray) or q.qtype.scheme != "nbits" or sc is None:
            return f"%{prefix}q is not an nbits code array with its scales"
        w = np.asarray(arrays[leaf], np.float64)
        w = w.T if transposed else w
        if tuple(q.shape) != w.shape:
            return f"codes of shape {tuple(q.shape)} do not cover the weight {w.shape}"
        deq = np.asarray(dequantize(q, np.asarray(sc), arrays.get(f"{prefix}z")), np.float64)
        step = np.repeat(np.abs(np.asarray(sc, np.float64)), q.qtype.block, axis=-1)[
            :, : w.shape[1]
        ]
        err = np.abs(deq - w)
        slack = step / 2 * (1 + 2.0**-20) + 2.0**-24 * np.abs(w)  # f32 dequantization rounding
        bad = np.argwhere(~(err <= slack))
        if bad.size:
            n, k = (int(v) for v in bad[0])
            return (
                f"weight [{n}, {k}] is {err[n, k]:.3g} from its dequantized code, more than "
                f"half its scale ({step[n, k] / 2:.3g}; {len(bad)} such weight(s))"
            )
        return None

    return check


def _magnitude(x: Term, w: Term, s: Term, transposed: bool) -> T:
    """sum_k |x_k| * max_g |s[n, g]|, as matmul(|x|, 0 * w + rowmax|s|)."""
    rowmax = t("core.reduce_max", t("core.abs", s), axes=(-1,), keepdims=True)  # [n, 1]
    if transposed:
        rowmax = t("core.transpose", rowmax, perm=(1, 0))  # [1, n] against w [k, n]
    per_weight = t("core.add", t("core.mul", w, K(0.0)), rowmax)
    return t("core.matmul", t("core.abs", x), per_weight, transpose_b=not transposed)


WEIGHT_BOUND_TEXT = "|rhs - lhs| <= 0.5 * sum_k |x[.., k]| * max |scale| of the weight row"


for _bits in BITS:
    for _sym in (True, False):
        _kind = f"int{_bits} {'symmetric' if _sym else 'asymmetric'}"
        for _tb in (True, False):
            _lhs = t("core.matmul", V("x"), V("w"), transpose_a=False, transpose_b=_tb)
            _sig = {"x": "... m k", "w": "n k" if _tb else "k n", "wq": "n k", "ws": "n g"}
            if not _sym:
                _sig["wz"] = "n g"
            rule(
                Rule(
                    name=weight_rule_name(_bits, _sym, "matmul" if _tb else "matmul-kn"),
                    summary=f"x @ w{'^T' if _tb else ''} ~ quantized_matmul over {_kind} blockwise codes of w"
                    f"{'' if _tb else '^T'} (|error| <= scale/2 per weight)",
                    lhs=_lhs,
                    rhs=_qmm(V("x"), "w", _sym),
                    sig=_sig,
                    tag="approximate",
                    bound=ErrorBound(
                        rel=0.5,
                        magnitude=_magnitude(V("x"), V("w"), V("ws"), not _tb),
                        text=WEIGHT_BOUND_TEXT,
                    ),
                    premise=weight_premise("w", "w", not _tb),
                    premise_text=f"|dequant(wq, ws{'' if _sym else ', wz'}) - w{'' if _tb else '^T'}| <= |ws| / 2",
                    numeric_check=weight_check("w", "w", not _tb),
                    dtypes={"wq": "i8", **({} if _sym else {"wz": "i8"})},
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
                    sig={
                        "x": "... s h",
                        "wg": "f h",
                        "wu": "f h",
                        "wd": "h f",
                        **{f"{p}q": "f h" for p in "gu"},
                        **{f"{p}s": "f g" for p in "gu"},
                        **{f"{p}z": "f g" for p in "gu"},
                        "dq": "h f",
                        "ds": "h g2",
                        "dz": "h g2",
                    },
                    tag="approximate",
                    bound=no_bound("the quantization error through the activation"),
                    dtypes={f"{p}{c}": "i8" for p in "gud" for c in "qz"},
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
        bound=ErrorBound(
            rel=0.5,
            magnitude=t(
                "core.concat",
                t("core.mul", V("past"), K(0.0)),
                t("core.add", t("core.mul", V("new"), K(0.0)), _S),
                axis=2,
            ),
            text="|rhs - lhs| <= scale / 2 on the new entries (scale = max |row| / 127), 0 on the past",
        ),
        passes=("kv-cache-int8",),
    )
)
