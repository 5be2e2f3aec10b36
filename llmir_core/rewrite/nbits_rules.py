"""Rules of lower-ort-matmul / lower-ort-embedding when a build quantizes f32 weights to
MatMulNBits blocks (`--quant int4|int8`): the lowered op is `ort.matmul_nbits {quantize = sym |
asym}` (or `ort.gather_block_quantized {quantize = sym}`), whose meaning is its decomposition:
`llm.quantize` of the float weight to the op's `nbits` format, then `llm.quantized_matmul` over
the codes, scales (and zero points), then the epilogue. Each rule states that step about the
original op, with the weight's own codes (`llm.quantize(w)`) in the replacement, so translation
validation meets the lowered op's expansion term for term (a gated MLP: fused with the SwiGLU
epilogue on llmir's kernel, or lowered op by op).

They are `approximate` and state an `ErrorBound` proved about their own terms
(`llmir_core.smt.prove_approx`), the rhs being `llm.quantize`'s own meaning (MLAS' quantizer,
`dialects/llm_smt.py`, its f32/f16 roundings uninterpreted functions):

- premise (about the quantizer's rounding, over the weight leaf): every weight is within
  `r * max |w row| + a` of its dequantized code, `a` = 2^-21 (f16 subnormal scales). `r` is the
  quantizer's per-weight error over the row's largest magnitude (the block's is at most that):
  symmetric, signed codes c = q - L in [-L, L - 1] (L = 2^(bits-1)), scale s = m / -L with m the
  block's value of largest magnitude: |c s - x| <= |s| (1 + 2 L u), u = 2^-11 the stored f16
  scale's rounding. Not s / 2: where a block holds both m and -m, -m maps to +L and is clamped
  to L - 1 (an error of one step); `nbits_sym_bound` proves it. So r = (1 + 2 L u) / L, with
  2^-9 relative slack for the f32 roundings. Asymmetric, codes and zero point in
  [0, 2^bits - 1] (top): |(q - z) s - x| <= s (1 + 2^(bits+1) u) (`nbits_asym_bound`), s =
  (hi - lo) / top <= 2 max |x| / top: r = 2 (1 + 2^(bits+1) u) / top, the same slack.
  `numeric_check` checks it on the concrete weight (quantized as the op does, block 32, f16 and
  f32 scales) at validation time;
- bound: matmul `|rhs - lhs| <= sum_k |x[.., k]| (r max |w[n]| + a)` (the magnitude term, times
  1 + 2^-40: see REL);
  embedding `|rhs - lhs| <= r max |table| + a` (not a function of the ids).
- the gated-MLP rules (swiglu, gated-mlp-<act>) state no bound (the quantization error through
  the activation has no per-term bound here, as for quantize-weights' gated-MLP rules): they are
  `unproved` and applied only with `--allow-unproved`.

The format (`format`: an `!quant<nbits, ...>`; proved for block 32 with f16 and f32 scales)
and, for the SwiGLU epilogue, the slice bounds (`half`, `full`) are attributes the lowering binds
in each instance it logs.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from llmir_core.ir.types import DType, QuantType

from .bounds import ErrorBound, gamma, no_bound
from .library import rule
from .proof_obligations import Obligation
from .rule import Rule
from .terms import A, K, T, Term, V, t

BITS = (4, 8)
F16_SCALE_REL = 2.0**-11  # an f32 scale rounded to f16 (the unit roundoff): the worse case
BLOCK = 32  # the block size the proof cases and the numeric check cover
SCALES = ("f32", "f16")
ABS_SLACK = 2.0**-21  # per weight: f16 scales of tiny blocks are subnormal (absolute error 2^-25)
F32_SLACK = 2.0**-9  # relative slack for the quantizer's f32 roundings
# The matmul bound is stated as REL * (SCALE * sum_k |x_k| radius_k), REL the prover's first
# per-term candidate (gamma(2)) so the reduction's lift proves on its first query, not after four
# failing ones (seconds, not tens of seconds); REL * SCALE = 1 + 2^-40 >= 1.
REL = gamma(2)
SCALE = (1 + 2.0**-40) / REL


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


def radius_rel(bits: int, symmetric: bool) -> float:
    """r: the per-weight error over the row's largest magnitude (the module docstring)."""
    u = F16_SCALE_REL
    if symmetric:
        lv = 1 << (bits - 1)
        return (1 + 2 * lv * u) * (1 + F32_SLACK) / lv
    top = (1 << bits) - 1
    return 2 * (1 + (1 << (bits + 1)) * u) * (1 + F32_SLACK) / top


def _formats(bits: int, symmetric: bool) -> tuple[QuantType, ...]:
    zero = "none" if symmetric else "int"
    return tuple(
        QuantType("nbits", bits, BLOCK, DType.f16 if sc == "f16" else DType.f32, zero)
        for sc in SCALES
    )


def _row_radius(w: Term, r: float) -> T:
    """r * max_k |w[n, k]| + a at every [n, k]."""
    rowmax = t("core.reduce_max", t("core.abs", w), axes=(-1,), keepdims=True)
    per = t("core.add", t("core.mul", w, K(0.0)), t("core.mul", rowmax, K(r)))
    return t("core.add", per, K(ABS_SLACK))


def _table_radius(table: Term, r: float) -> T:
    """r * max |table| + a: a scalar (an embedding's bound cannot depend on the ids)."""
    top = t("core.reduce_max", t("core.abs", table), axes=(0, 1), keepdims=False)
    return t("core.add", t("core.mul", top, K(r)), K(ABS_SLACK))


def quantizer_premise(leaf: str, radius: Term, depth: int, factor: str | None = None) -> Any:
    """(solver child) each weight is within `radius` of its dequantized code: a fact at every
    weight element the query reads, with the dequantized code the rhs's own term (llm.quantize's
    meaning for the proof case's format) and the radius the bound's own term. `depth`: how many
    reductions the rhs reads the weight inside (1 in a matmul's sum, 0 in a lookup), so the
    fact's terms are built with the same bound indices (equal ASTs). `factor`: the activation
    leaf the weight is multiplied by in a contraction (its last index the weight's): the fact is
    also stated times each such element the query reads, in the sum-of-monomials form the
    contraction's body is simplified to (z3 then needs no nonlinear step to use it)."""

    def premise(enc: Any, ts: dict[str, Any], dims: dict[str, Any]) -> dict[str, Any]:
        import z3

        from llmir_core.dialects import llm_smt
        from llmir_core.smt.semantics import STensor

        fmt = enc.case["format"]

        def encode(term: Term) -> Any:
            if isinstance(term, V):
                return ts[term.name]
            if isinstance(term, K):
                f = Fraction(term.value)
                c = z3.RealVal(f"{f.numerator}/{f.denominator}")
                return STensor((), lambda i: c)
            assert isinstance(term, T)
            return enc.op(term.op, [encode(a) for a in term.args], dict(term.attrs))[term.result]

        def zabs(e: Any) -> Any:
            return z3.If(e >= 0, e, -e)

        weights: list[tuple[Any, Any, Any]] = []  # (weight element, its dequantized code, radius)
        factors: list[Any] = []

        def times(xa: Any, wa: Any, deq: Any, r: Any) -> list[Any]:
            if not xa.arg(xa.num_args() - 1).eq(wa.arg(wa.num_args() - 1)):
                return []

            def som(e: Any) -> Any:
                return z3.simplify(e, som=True)

            return [zabs(som(xa * deq) - som(xa * wa)) <= som(zabs(xa) * r)]

        def lemma(app: Any) -> list[Any]:
            ix = tuple(app.arg(j) for j in range(app.num_args()))
            saved = enc._depth
            enc._depth = depth
            try:
                codes = enc.op("llm.quantize", [ts[leaf]], {"format": fmt})
                deq = llm_smt.nbits_values(enc, fmt, codes).f(ix)
                rad = encode(radius)
                r = rad.f(ix[len(ix) - rad.rank :]) if rad.rank else rad.f(())
            finally:
                enc._depth = saved
            weights.append((app, deq, r))
            out = [zabs(deq - app) <= r]
            for xa in factors:
                out += times(xa, app, deq, r)
            return out

        def factor_lemma(app: Any) -> list[Any]:
            factors.append(app)
            return [f for wa, deq, r in weights for f in times(app, wa, deq, r)]

        enc.app_lemma[leaf] = lemma
        if factor is not None:
            enc.app_lemma[factor] = factor_lemma
        return {}

    return premise


def quantizer_check(leaf: str, bits: int, symmetric: bool, rows: bool) -> Any:
    """The premise on the concrete weight, quantized as the op does (block 32, f16 and f32
    scales): None when every weight is within the radius of its dequantized code."""
    r = radius_rel(bits, symmetric)

    def check(arrays: dict[str, Any]) -> str | None:
        from llmir_core.quant import nbits

        if arrays.get(leaf) is None:
            return f"the weight %{leaf} is not a constant of the module"
        w = np.asarray(arrays[leaf], np.float32)
        if w.ndim != 2 or w.shape[1] % BLOCK:
            return f"the weight {w.shape} is not rows of {BLOCK}-blocks"
        top = np.max(np.abs(w), axis=1, keepdims=True) if rows else np.max(np.abs(w))
        rad = r * top.astype(np.float64) + ABS_SLACK
        for sc in SCALES:
            codes, scales, zp = nbits.quantize(
                w, bits, BLOCK, symmetric, np.dtype(sc.replace("f", "float"))
            )
            q = nbits.unpack_codes(codes.reshape(w.shape[0], -1), bits, w.shape[1])
            nb = w.shape[1] // BLOCK
            zero = (
                np.full((w.shape[0], nb), 1 << (bits - 1))
                if zp is None
                else nbits.unpack_codes(zp, bits, nb)
            )
            deq = (q.astype(np.float64) - np.repeat(zero, BLOCK, axis=1)) * np.repeat(
                np.asarray(scales, np.float64), BLOCK, axis=1
            )
            err = np.abs(deq - w.astype(np.float64))
            bad = np.argwhere(~(err <= rad))
            if bad.size:
                n, k = (int(v) for v in bad[0])
                lim = float(np.broadcast_to(rad, w.shape)[n, k])
                return (
                    f"weight [{n}, {k}] is {err[n, k]:.3g} from its dequantized code ({sc} "
                    f"scales), more than the radius {lim:.3g} ({len(bad)} such weight(s))"
                )
        return None

    return check


def _matmul_proof(bits: int, sym: bool) -> dict[str, Any]:
    """The matmul rule's bound, premise and check (Rule fields)."""
    r = radius_rel(bits, sym)
    return {
        "bound": ErrorBound(
            rel=REL,
            magnitude=t(
                "core.matmul",
                t("core.abs", V("x")),
                t("core.mul", _row_radius(V("w"), r), K(SCALE)),
                transpose_b=True,
            ),
            text=f"|rhs - lhs| <= (1 + 2^-40) * sum_k |x[.., k]| * ({r:.6g} * max |w row| + 2^-21)",
        ),
        "proof_cases": tuple({"format": f} for f in _formats(bits, sym)),
        "premise": quantizer_premise("w", _row_radius(V("w"), r), depth=1, factor="x"),
        "premise_text": f"|dequant(quantize(w)) - w| <= {r:.6g} * max |w row| + 2^-21 "
        "(MLAS' quantizer, block 32)",
        "numeric_check": quantizer_check("w", bits, sym, rows=True),
    }


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
                **_matmul_proof(_bits, _sym),
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
                bound=no_bound("the quantization error through the SwiGLU epilogue"),
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
                    bound=no_bound("the quantization error through the activation"),
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
            bound=ErrorBound(
                rel=1.0,
                magnitude=_table_radius(V("table"), radius_rel(_bits, True)),
                text=f"|rhs - lhs| <= {radius_rel(_bits, True):.6g} * max |table| + 2^-21",
            ),
            proof_cases=tuple({"format": f, "dtype": DType.f32} for f in _formats(_bits, True)),
            premise=quantizer_premise(
                "table", _table_radius(V("table"), radius_rel(_bits, True)), depth=0
            ),
            premise_text=f"|dequant(quantize(table)) - table| <= {radius_rel(_bits, True):.6g} * "
            "max |table| + 2^-21 (MLAS' quantizer, block 32)",
            numeric_check=quantizer_check("table", _bits, True, rows=False),
            passes=("lower-ort-embedding",),
        )
    )
