"""The one verdict lattice of `verify --rules`, `--verify-each`, `verify --against`, reports and
JSON.

- `equivalent`: exact, proved (the two sides compute the same values);
- `within-bound`: approximate: |after - before| <= B, B composed from the rules' own proved
  bounds over the applied instances and the declared input ranges (printed with the verdict);
- `not-equivalent`: a counterexample input (and the pass/op/line where it applies);
- `inconclusive`: neither could be shown (exit 3); also when differential testing alone found
  no difference: agreement on a few inputs is evidence, not a proof, so it is reported as
  `inconclusive` with the measured error, never as `equivalent` or `within bound`.

Never `equivalent` across an approximate rule. Every verdict carries the method that gave it.
"""

from __future__ import annotations

from typing import Any

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


def exit_code(verdict: str | None) -> int:
    return EXIT_CODES.get(verdict or EQUIVALENT, EXIT_INCONCLUSIVE)


def ok(verdict: str | None) -> bool:
    """Whether the verdict lets a pipeline or a check pass (exit 0)."""
    return exit_code(verdict) == 0


def summary(res: dict[str, Any]) -> str:
    """One line: the verdict (with B), then `(by METHOD)`; what B is follows on its own line
    (`bound_line`)."""
    return f"{label(res.get('verdict', INCONCLUSIVE), res.get('bound'))} (by {res.get('method')})"


def bound_line(res: dict[str, Any]) -> str | None:
    if res.get("verdict") != WITHIN_BOUND or res.get("bound") is None:
        return None
    text = f"B = {res['bound']:.6g}: {res.get('bound_is', 'max |error| over the outputs')}"
    if res.get("measured") is not None:
        text += f"; measured {res['measured']:.3g}"
    return text


def instance_lines(res: dict[str, Any]) -> list[str]:
    """One line per approximate rule instance of a `within bound` verdict: where, and its local
    bound with where that bound came from."""
    return [
        f"{row['rule']} at {row['location']}: local bound {row['local_bound']:.3g} "
        f"({row['bound_from']})"
        for row in res.get("rule_instances", [])
    ]
