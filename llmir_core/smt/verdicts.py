"""The one verdict lattice of `verify --rules`, `--verify-each`, `verify --against`, reports and
JSON.

- `equivalent`: exact, proved (the two sides compute the same values);
- `within-bound`: approximate: |after - before| <= B, B composed from the rules' own proved
  bounds over the applied instances and the declared input ranges (printed with the verdict);
- `not-equivalent`: a counterexample input (and the pass/op/line where it applies);
- `inconclusive`: neither could be shown (exit 3).

Never `equivalent` across an approximate rule.
"""

from __future__ import annotations

from llmir_core.errors import EXIT_CHECK_FAILED, EXIT_INCONCLUSIVE

EQUIVALENT = "equivalent"
WITHIN_BOUND = "within-bound"
NOT_EQUIVALENT = "not-equivalent"
INCONCLUSIVE = "inconclusive"
VERDICTS = (EQUIVALENT, WITHIN_BOUND, NOT_EQUIVALENT, INCONCLUSIVE)

EXIT_CODES: dict[str, int] = {
    EQUIVALENT: 0,
    WITHIN_BOUND: 0,
    NOT_EQUIVALENT: EXIT_CHECK_FAILED,
    INCONCLUSIVE: EXIT_INCONCLUSIVE,
}


def label(verdict: str, bound: float | None = None) -> str:
    """The verdict as printed: `within bound 3.1e-03` carries its bound."""
    if verdict == WITHIN_BOUND:
        return "within bound " + ("?" if bound is None else f"{bound:.3g}")
    return verdict.replace("-", " ")
