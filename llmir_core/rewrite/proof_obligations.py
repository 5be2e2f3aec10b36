"""Proof obligations of the fusion, lifting, quantization and precision rules.

Each function returns a zero-argument callable that builds `(hypotheses, goal, symbols)` for z3;
`llmir verify --rules` calls it inside the solver child (so z3 is imported only there) and
proves `hypotheses => goal` (unsat of `hypotheses and not goal`).

- `equality`: `lhs == rhs` elementwise for symbolic dims, at a symbolic index, for each batch
  rank, with the element-level semantics of `llmir_core.rewrite.smt_ext` (which extends the base
  encoder with the fused ops' definitions and the shape ops of exported patterns).

The obligation remembers the terms it was built from (`terms`) so the prover can check that it
is about the rule's own lhs and rhs, and rebuilds itself for other sides (`rebuild`, used by the
mutation report). Approximate rules have no obligation: they state an `ErrorBound` that
`llmir_core.smt.prove_approx` proves about their own terms.
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

    def rebuild(new_lhs: Term, new_rhs: Term) -> Obligation:
        return equality(
            new_lhs,
            new_rhs,
            sig,
            batch_ranks,
            assume=assume,
            proof_attrs=proof_attrs,
            int_leaves=int_leaves,
            hyps_at=hyps_at,
        )

    obligation.terms = (lhs, rhs)  # type: ignore[attr-defined]
    obligation.rebuild = rebuild  # type: ignore[attr-defined]
    return obligation
