"""Proof obligations of the fusion, lifting, quantization and precision rules.

Each function returns a zero-argument callable that builds `(hypotheses, goal, symbols)` for z3;
`llmir verify --rules` calls it inside the solver child (so z3 is imported only there) and
proves `hypotheses => goal` (unsat of `hypotheses and not goal`).

- `equality`: `lhs == rhs` elementwise for symbolic dims, at a symbolic index, for each batch
  rank, with the element-level semantics of `llmir_core.rewrite.smt_ext` (which extends the base
  encoder with the fused ops' definitions and the shape ops of exported patterns).
- `sym_quant_bound` / `asym_quant_bound`: the error-bound lemmas of approximate quantization
  rules, with integer codes (a code is an integer within 1/2 of its real value: any rounding).
- `rounding_bound`: the relative error of rounding to a narrower float (assign-precision).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .terms import Term

Obligation = Callable[[], tuple[list[Any], Any, list[Any]]]


def equality(
    lhs: Term,
    rhs: Term,
    sig: dict[str, str],
    batch_ranks: Sequence[int] = (0, 1),
    *,
    assume: Callable[[dict[str, Any]], list[Any]] | None = None,
    proof_attrs: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None,
    int_leaves: Sequence[str] = (),
    hyps_at: Callable[[dict[str, Any], tuple[Any, ...]], list[Any]] | None = None,
) -> Obligation:
    """`lhs == rhs` (shapes and elements). `sig` gives each leaf's shape (`"... m k"`, named dims,
    `"2*h"` products); `proof_attrs(batch, syms)` binds attribute variables (and `__op__` hints
    for the encoder); `assume(syms)` and `hyps_at(syms, index)` add hypotheses (a rule's
    precondition, instantiated at the symbolic index)."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        from .smt_ext import encode_equality

        return encode_equality(lhs, rhs, sig, batch_ranks, assume, proof_attrs, int_leaves, hyps_at)

    return obligation


def sym_quant_bound(levels: int, scale_rel_err: float = 2.0**-10) -> Obligation:
    """Symmetric quantization with codes in [-levels, levels] (int8: 127, int4: 7): the stored
    scale s is amax / levels up to a relative `scale_rel_err` (its rounding to f32 or f16), and
    the code q is any integer within 1/2 of x / s. Claim, for every |x| <= amax: q fits
    (|q| <= levels, so clamping never changes it) and |q * s - x| <= s / 2."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        import z3

        x, amax, s = z3.Reals("x amax s")
        q = z3.Int("q")
        t = x / s
        qr = z3.ToReal(q)
        hyps = [
            amax > 0,
            z3.Abs(x) <= amax,
            s > 0,
            z3.Abs(s * levels - amax) <= amax * scale_rel_err,
            z3.Abs(qr - t) <= z3.RealVal(1) / 2,
        ]
        goal = z3.And(z3.Abs(qr) <= levels, z3.Abs(qr * s - x) <= s / 2)
        return hyps, goal, [x, amax, s, q]

    return obligation


def asym_quant_bound(levels: int) -> Obligation:
    """Asymmetric quantization with codes in [0, levels] (int8: 255, int4: 15): lo = min(min, 0),
    hi = max(max, 0), s = (hi - lo) / levels, zero point z = an integer within 1/2 of -lo / s,
    code q = clamp(r, 0, levels) for an integer r within 1/2 of x / s + z. Claim, for every
    lo <= x <= hi: z and q are codes and |(q - z) * s - x| <= s / 2."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        import z3

        x, lo, hi = z3.Reals("x lo hi")
        z, r = z3.Ints("z r")
        s = (hi - lo) / levels
        zr, rr = z3.ToReal(z), z3.ToReal(r)
        half = z3.RealVal(1) / 2
        q = z3.If(r < 0, 0, z3.If(r > levels, levels, r))
        hyps = [
            lo <= 0,
            hi >= 0,
            hi - lo > 0,
            lo <= x,
            x <= hi,
            z3.Abs(zr + lo / s) <= half,
            z3.Abs(rr - (x / s + zr)) <= half,
        ]
        goal = z3.And(
            0 <= z, z <= levels, 0 <= q, q <= levels, z3.Abs((z3.ToReal(q) - zr) * s - x) <= s / 2
        )
        return hyps, goal, [x, lo, hi, z, r]

    return obligation


def rounding_bound(mantissa_bits: int, operands: int) -> Obligation:
    """Rounding each of `operands` inputs of a product to a float with `mantissa_bits` explicit
    mantissa bits (f16: 10, bf16: 7; unit roundoff u = 2^-(m+1)), in its normal range, changes
    the product by at most ((1 + u)^n - 1) * |exact product|: the per-element bound a lowered
    matmul or elementwise product sums (|sum of errors| <= bound * sum of |terms|)."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        import z3

        u = z3.RealVal(2) ** -(mantissa_bits + 1)
        xs = [z3.Real(f"x{i}") for i in range(operands)]
        ds = [z3.Real(f"d{i}") for i in range(operands)]
        exact, rounded = z3.RealVal(1), z3.RealVal(1)
        for x, d in zip(xs, ds):
            exact = exact * x
            rounded = rounded * (x * (1 + d))
        bound = (1 + u) ** operands - 1
        hyps = [z3.Abs(d) <= u for d in ds]
        goal = z3.Abs(rounded - exact) <= bound * z3.Abs(exact)
        return hyps, goal, xs + ds

    return obligation
