"""Rules of lower-ort-matmul / lower-ort-embedding when a build quantizes f32 weights to
MatMulNBits blocks (`--quant int4|int8`): the lowered op is `ort.matmul_nbits {quantize = sym |
asym}` (or `ort.gather_block_quantized {quantize = sym}`), whose meaning is its decomposition:
`llm.quantize` of the float weight to the op's `nbits` format, then `llm.quantized_matmul` over
the codes, scales (and zero points), then the epilogue. Each rule states that step about the
original op, with the weight's own codes (`llm.quantize(w)`) in the replacement, so translation
validation meets the lowered op's expansion term for term (a gated MLP: fused with the SwiGLU
epilogue on llmir's kernel, or lowered op by op).

They are `approximate`: the replacement rounds the weight. What is proved is the per-element
error bound of the quantizer onnxruntime's MatMulNBits uses (MLAS, `llmir_core/quant/nbits.py`),
with the stored scale rounded (f16 scales: relative error 2^-11):

- symmetric: signed codes c = q - L in [-L, L - 1] (L = 2^(bits-1)), scale s = m / -L with m the
  block's value of largest magnitude: |c * s - x| <= |s| * (1 + 2 L u). Not s / 2: where a block
  holds both m and -m, -m maps to +L and is clamped to L - 1 (an error of one step);
- asymmetric: codes and zero point in [0, 2^bits - 1]: |(q - z) * s - x| <= |s| * (1 + 2^(bits+1) u).

The format (`format`: an `!quant<nbits, ...>`) and, for the SwiGLU epilogue, the slice bounds
(`half`, `full`) are attributes the lowering binds in each instance it logs.
"""

from __future__ import annotations

from typing import Any

from .library import rule
from .proof_obligations import Obligation
from .rule import Rule
from .terms import A, T, V, t

BITS = (4, 8)
F16_SCALE_REL = 2.0**-11  # an f32 scale rounded to f16 (the unit roundoff): the worse case


def rule_name(bits: int, symmetric: bool, consumer: str) -> str:
    return f"nbits-int{bits}-{'sym' if symmetric else 'asym'}-{consumer}"


def nbits_sym_bound(bits: int, rel: float = F16_SCALE_REL) -> Obligation:
    """MLAS symmetric blocks: s = sigma * amax / L * (1 + d) (sigma the sign of -m, |d| <= rel),
    c = clamp(r, -L, L - 1) for an integer r within 1/2 of x / s, |x| <= amax. Claim: c is a code
    and |c * s - x| <= |s| * (1 + 2 L rel)."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        import z3

        lv = 1 << (bits - 1)
        x, amax, d = z3.Reals("x amax d")
        r = z3.Int("r")
        neg = z3.Bool("m_negative")
        s = z3.If(neg, 1, -1) * amax / lv * (1 + d)
        c = z3.If(r < -lv, -lv, z3.If(r > lv - 1, lv - 1, r))
        hyps = [
            amax > 0,
            z3.Abs(x) <= amax,
            z3.Abs(d) <= rel,
            z3.Abs(z3.ToReal(r) - x / s) <= z3.RealVal(1) / 2,
        ]
        err = z3.Abs(z3.ToReal(c) * s - x)
        goal = z3.And(-lv <= c, c <= lv - 1, err <= z3.Abs(s) * (1 + 2 * lv * rel))
        return hyps, goal, [x, amax, d, r]

    return obligation


def nbits_asym_bound(bits: int, rel: float = F16_SCALE_REL) -> Obligation:
    """MLAS asymmetric blocks: lo = min(min, 0) <= x <= hi = max(max, 0), s32 = (hi - lo) / top,
    zero z = clamp(an integer within 1/2 of -lo / s32, 0, top), the stored scale s = s32 (1 + d)
    and q = clamp(an integer within 1/2 of x / s + z, 0, top). Claim: z and q are codes and
    |(q - z) * s - x| <= s * (1 + 2 top rel)."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        import z3

        top = (1 << bits) - 1
        x, lo, hi, d = z3.Reals("x lo hi d")
        zi, r = z3.Ints("zi r")
        s32 = (hi - lo) / top
        s = s32 * (1 + d)
        z = z3.If(zi < 0, 0, z3.If(zi > top, top, zi))
        q = z3.If(r < 0, 0, z3.If(r > top, top, r))
        half = z3.RealVal(1) / 2
        hyps = [
            lo <= 0,
            hi >= 0,
            hi - lo > 0,
            lo <= x,
            x <= hi,
            z3.Abs(d) <= rel,
            z3.Abs(z3.ToReal(zi) + lo / s32) <= half,
            z3.Abs(z3.ToReal(r) - (x / s + z3.ToReal(z))) <= half,
        ]
        err = z3.Abs((z3.ToReal(q) - z3.ToReal(z)) * s - x)
        goal = z3.And(0 <= z, z <= top, 0 <= q, q <= top, err <= s * (1 + 2 * top * rel))
        return hyps, goal, [x, lo, hi, d, zi, r]

    return obligation


def _codes(w: Any, symmetric: bool) -> tuple[T, ...]:
    """The results of llm.quantize(w) to the bound nbits format: codes, scales(, zero points)."""
    n = 2 if symmetric else 3
    return tuple(T("llm.quantize", (w,), {"format": A("format")}, i) for i in range(n))


def _qmm(x: Any, w: Any, symmetric: bool) -> T:
    return T("llm.quantized_matmul", (x, *_codes(w, symmetric)), {"transpose_b": True})


def _swiglu(y: Any) -> T:
    """silu(y[..., :H]) * y[..., H:]: ort's epilogue, as its decomposition writes it."""
    g = t("core.slice", y, starts=(0,), ends=A("half"), axes=(-1,))
    u = t("core.slice", y, starts=A("half"), ends=A("full"), axes=(-1,))
    return t("core.mul", t("core.silu", g), u)


def _bound(bits: int, symmetric: bool) -> Obligation:
    return nbits_sym_bound(bits) if symmetric else nbits_asym_bound(bits)


for _bits in BITS:
    for _sym in (True, False):
        _kind = f"int{_bits} {'symmetric' if _sym else 'asymmetric'} nbits blocks"
        rule(
            Rule(
                name=rule_name(_bits, _sym, "matmul"),
                summary=f"x @ w^T ~ quantized_matmul over the {_kind} of w "
                "(ort.matmul_nbits {quantize} over f32 w)",
                lhs=t("core.matmul", V("x"), V("w"), transpose_a=False, transpose_b=True),
                rhs=_qmm(V("x"), V("w"), _sym),
                sig={"x": "... m k", "w": "n k"},
                tag="approximate",
                obligation=_bound(_bits, _sym),
                passes=("lower-ort-matmul",),
            )
        )
        _y = _qmm(V("x"), t("core.concat", V("wg"), V("wu"), axis=0), _sym)
        rule(
            Rule(
                name=rule_name(_bits, _sym, "swiglu"),
                summary=f"a gated MLP (silu) ~ one quantized_matmul over the {_kind} of "
                "[wg; wu] with the SwiGLU epilogue, then one over those of wd",
                lhs=t("llm.gated_mlp", V("x"), V("wg"), V("wu"), V("wd"), activation="silu"),
                rhs=_qmm(_swiglu(_y), V("wd"), _sym),
                sig={"x": "... s h", "wg": "f h", "wu": "f h", "wd": "h f"},
                tag="approximate",
                obligation=_bound(_bits, _sym),
                passes=("lower-ort-matmul",),
            )
        )
        for _act in ("silu", "gelu", "gelu_tanh"):
            _g = _qmm(V("x"), V("wg"), _sym)
            if _act == "silu":
                _ga = t("core.silu", _g)
            else:
                _ga = t("core.gelu", _g, approximate="none" if _act == "gelu" else "tanh")
            _h = t("core.mul", _ga, _qmm(V("x"), V("wu"), _sym))
            rule(
                Rule(
                    name=rule_name(_bits, _sym, f"gated-mlp-{_act}"),
                    summary=f"a gated MLP ({_act}) ~ its three matmuls as quantized_matmuls over "
                    f"the {_kind} of its weights (lowered op by op)",
                    lhs=t("llm.gated_mlp", V("x"), V("wg"), V("wu"), V("wd"), activation=_act),
                    rhs=_qmm(_h, V("wd"), _sym),
                    sig={"x": "... s h", "wg": "f h", "wu": "f h", "wd": "h f"},
                    tag="approximate",
                    obligation=_bound(_bits, _sym),
                    passes=("lower-ort-matmul",),
                )
            )
    _table = T("llm.dequantize", _codes(V("table"), True), {"dtype": A("dtype")})
    rule(
        Rule(
            name=rule_name(_bits, True, "embedding"),
            summary=f"an embedding lookup ~ the lookup in the table rounded to int{_bits} "
            "symmetric nbits blocks along its rows (ort.gather_block_quantized {quantize})",
            lhs=t("llm.embedding", V("table"), V("ids")),
            rhs=t("llm.embedding", _table, V("ids")),
            sig={"table": "v h", "ids": "... s"},
            tag="approximate",
            obligation=_bound(_bits, True),
            passes=("lower-ort-embedding",),
        )
    )
