"""Proof obligations that are not `lhs == rhs` (approximate rules): built in the solver child."""

from __future__ import annotations

from typing import Any


def quant_error_bound(levels: int, divisor: float | None = None) -> Any:
    """Symmetric quantization with `levels` positive codes (127 for int8, 7 for int4):
    s = amax / levels, q = round(x / s), x' = q * s. Claim, for every |x| <= amax:
    the code fits (|x / s| <= levels, so nothing clamps) and |x' - x| <= s / 2.
    `round` is uninterpreted with the ground lemma |round(t) - t| <= 1/2."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        import z3

        x, amax = z3.Reals("x amax")
        rnd = z3.Function("round", z3.RealSort(), z3.RealSort())
        s = amax / (divisor if divisor is not None else levels)
        t = x / s
        hyps = [amax > 0, z3.Abs(x) <= amax, z3.Abs(rnd(t) - t) <= z3.RealVal(1) / 2]
        goal = z3.And(z3.Abs(t) <= levels, z3.Abs(rnd(t) * s - x) <= s / 2)
        return hyps, goal, [x, amax]

    return obligation
