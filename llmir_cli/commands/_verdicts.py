"""Rendering the translation-validation verdicts of `optimize --verify-each` (stderr lines)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmir_core.smt.verdicts import WITHIN_BOUND, bound_line, label


def render_verdicts(result: Any, write: Callable[[str], Any]) -> None:
    """The pipeline's verdict, what B is for each pass within bound, and why a pass failed or
    was inconclusive (its details, the counterexample input)."""
    verdict = result.verdict
    if verdict is None:
        return
    bounds = [r.validation.get("bound") for r in result.runs if r.validation]
    bounds = [b for b in bounds if b is not None]
    # each pass's B bounds |its output - its input module's output| on the same inputs, so the
    # pipeline's is their sum (the triangle inequality)
    b = sum(bounds) if verdict == WITHIN_BOUND and bounds else None
    write(
        f"verdict: {label(verdict, b)}"
        + (" (the sum of the passes' B)" if len(bounds) > 1 and b is not None else "")
        + "\n"
    )
    for r in result.runs:
        line = bound_line(r.validation or {})
        if line:
            write(f"  [{r.name}] {line}\n")
    failed = result.failed_validation
    for item, head in [(failed, "error: pass '{}' did not validate")] + [
        (x, "warning: pass '{}' is not proved") for x in result.inconclusive
    ]:
        if item is None:
            continue
        write(
            head.format(item["pass"])
            + f": {label(item.get('verdict', ''))} ({item.get('method')})\n"
        )
        for line in item.get("details", []):
            write(f"  {line}\n")
        if item.get("input") is not None:
            write(f"  input: {item['input']}\n")
