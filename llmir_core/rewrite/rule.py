"""A rewrite rule is data: pattern, precondition with a reason, replacement, tag, proof obligation.

`lhs` is the pattern (its root is the op being replaced), `rhs` the replacement, both terms over
the same leaves (`llmir_core.rewrite.terms`). `check(match)` returns None when the rule applies
and otherwise the reason it does not (shown by `optimize --report`). The proof obligation is
`lhs == rhs` elementwise, for every shape of the ranks listed in `batch_ranks`, under the SMT
assumptions `assume` (e.g. `eps > 0`); `llmir verify --rules` discharges it with z3
(`llmir_core.smt.prove`). Tags:

- `exact`: equal over the reals and in floating point;
- `reassociating`: equal over the reals; floating point may differ by rounding (checked per dtype
  with tolerance-based differential tests);
- `approximate`: not equal (rounding to a narrower float, quantization): `bound` states the
  error bound `|rhs - lhs| <= abs + rel * magnitude` that is proved about the rule's own `lhs`
  and `rhs` terms, with rounding made explicit (`llmir_core.smt.prove_approx`). `premise` states what
  the proof assumes about the leaves (quantization codes within half a step of the weight) and
  `numeric_check` checks that premise on concrete arrays (translation validation calls it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmir_core.ir.core import Op, Value

from .bounds import ErrorBound
from .terms import Match, T, Term, fmt_term, leaves, match

TAGS = ("exact", "reassociating", "approximate")

CheckFn = Callable[[Match], "str | None"]
# leaf name -> concrete array: None when the rule's premise holds on them, else the reason
NumericCheck = Callable[[dict[str, Any]], "str | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str
    lhs: T
    rhs: Term
    sig: dict[str, str]  # leaf -> shape ("... m k": batch prefix then named dims; "" = scalar)
    tag: str = "exact"
    check: CheckFn | None = None
    assume: Callable[[dict[str, Any]], list[Any]] | None = None  # z3 symbols -> assumptions
    proof_attrs: Callable[[int], dict[str, Any]] | None = None  # batch rank -> attr bindings
    batch_ranks: tuple[int, ...] = (0, 1)
    # exact rules whose encoding needs more than the base encoder: `proof_obligations.equality`
    # over this rule's own lhs and rhs (the prover checks it is about them)
    obligation: Callable[[], Any] | None = None
    passes: tuple[str, ...] = ()
    dtypes: dict[str, str] = field(default_factory=dict)  # leaf -> dtype in the proof instance
    bound: ErrorBound | None = None  # approximate rules: |rhs - lhs| <= bound, proved
    # attribute bindings, each proved (all must hold); for approximate rules
    proof_cases: tuple[dict[str, Any], ...] = ()
    # (solver child) encoder, leaf tensors, dims -> leaf tensors the proof rewrites by the premise
    premise: Callable[[Any, dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    premise_text: str = ""
    numeric_check: NumericCheck | None = None

    def __post_init__(self) -> None:
        if self.tag not in TAGS:
            raise ValueError(f"rule {self.name}: tag must be one of {TAGS}")
        missing = set(leaves(self.lhs)) - set(self.sig)
        if self.bound is not None and self.obligation is not None:
            raise ValueError(
                f"rule {self.name}: a bound is proved about lhs/rhs, not an obligation"
            )
        if missing and self.obligation is None:
            raise ValueError(f"rule {self.name}: no signature for leaves {sorted(missing)}")

    @property
    def text(self) -> str:
        return f"{fmt_term(self.lhs)} -> {fmt_term(self.rhs)}"

    @property
    def fingerprint(self) -> str:
        """Identifies the statement that was proved (patterns, signature, tag, bound)."""
        body = "|".join(
            [
                self.name,
                self.text,
                repr(sorted(self.sig.items())),
                self.tag,
                repr(self.batch_ranks),
                repr(sorted(self.dtypes.items())),
                self.bound.describe() if self.bound is not None else "",
                repr([sorted((k, repr(v)) for k, v in c.items()) for c in self.proof_cases]),
                self.premise_text,
            ]
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def match(self, root: Op) -> Match | None:
        if root.name != self.lhs.op or len(root.results) <= self.lhs.result:
            return None
        return match(self.lhs, root.results[self.lhs.result])

    def reject_reason(self, m: Match) -> str | None:
        return self.check(m) if self.check is not None else None


@dataclass
class RuleInstance:
    """One application of a rule, logged for translation validation and the report."""

    rule: str
    root: str  # the replaced value's name
    replacement: str  # the new value's name
    bindings: dict[str, str]  # leaf -> value name
    consts: dict[str, float]
    attrs: dict[str, Any]
    location: str


def value_loc(v: Value) -> str:
    op = v.owner
    if op is None:
        return f"%{v.name}"
    parts = [f"%{v.name}"]
    if op.pos is not None:
        parts.append(str(op.pos))
    if op.origin:
        parts.append(f'loc("{op.origin}")')
    return " ".join(parts)
