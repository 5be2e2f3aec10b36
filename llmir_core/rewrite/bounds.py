"""The error bound an approximate rule states about its own terms.

An exact rule proves `rhs == lhs`. An approximate rule (rounding to a narrower float,
quantization, a reassociation that changes rounding) proves, elementwise over the rule's own
`lhs` and `rhs` terms, with rounding made explicit:

    |rhs - lhs| <= abs + rel * magnitude

where `magnitude` is a term over the rule's leaves (non-negative, the result's shape), or `|lhs|`
when it is None. The same statement is read three ways:

- `llmir verify --rules` proves it with z3 (`llmir_core.smt.prove`);
- translation validation composes it over the applied rule instances and the declared input
  ranges into the verdict `within bound B` (`llmir_core.smt.tv`): `magnitude` is evaluated over
  the instance's leaves (concrete weights or interval bounds of activations);
- the report prints `text`.

`unit_roundoff` is the target type's u = 2^-(mantissa bits + 1) (f16 2^-11, bf16 2^-8, f32 2^-24).
"""

from __future__ import annotations

from dataclasses import dataclass

from .terms import Term

UNIT_ROUNDOFF: dict[str, float] = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}

# The prover's rounding model (`llmir_core.smt.prove_approx`), one for every target float:
# round(x) = x (1 + d) + e with |d| <= ROUND_U (bf16's u, the largest) and |e| <= ROUND_H (f16's
# half subnormal spacing, the largest), so |round(x) - x| <= ROUND_U * (|x| + ROUND_TINY).
ROUND_U = 2.0**-8
ROUND_H = 2.0**-25
ROUND_TINY = ROUND_H / ROUND_U


def gamma(n: int) -> float:
    """(1 + u)^n - 1: the relative error of n roundings in a chain."""
    return (1 + ROUND_U) ** n - 1


@dataclass(frozen=True)
class ErrorBound:
    """Elementwise |rhs - lhs| <= abs + rel * magnitude (magnitude None: |lhs|)."""

    rel: float = 0.0
    abs: float = 0.0
    magnitude: Term | None = None
    text: str = ""

    def describe(self) -> str:
        if self.text:
            return self.text
        mag = "|lhs|" if self.magnitude is None else "magnitude"
        parts = [f"{self.rel:.3g} * {mag}"] if self.rel else []
        if self.abs:
            parts.append(f"{self.abs:.3g}")
        return "|rhs - lhs| <= " + (" + ".join(parts) or "0")


def no_bound(why: str) -> ErrorBound:
    """An approximate rule whose error bound is not stated (so not proved): `unproved`."""
    return ErrorBound(rel=float("inf"), text=f"no bound proved: {why}")
