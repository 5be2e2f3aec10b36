"""`llmir verify --rules`: prove the whole rule library and (optionally) write the certificate
the passes read.

Verdicts speak the lattice of `llmir_core.smt.verdicts`: an exact rule proved is `equivalent`,
an approximate rule proved is `within-bound` (with its bound's text), a refuted rule is
`not-equivalent` (with the counterexample), anything else (unknown, timeout, unproved) is
`inconclusive` (exit 3). The certificate keeps the prover's words (`proved`, `refuted`, ...).
"""

from __future__ import annotations

import json
from typing import Any

from llmir_core.fileio import write_text_atomic
from llmir_core.rewrite.library import CERT_PATH, RULES
from llmir_core.rewrite.rule import Rule

from .prove import RuleVerdict, prove
from .verdicts import EQUIVALENT, EXIT_CODES, INCONCLUSIVE, NOT_EQUIVALENT, WITHIN_BOUND


def lattice(v: RuleVerdict) -> str:
    """The prover's verdict in the one verdict lattice."""
    if v.verdict == "proved":
        return WITHIN_BOUND if v.tag == "approximate" else EQUIVALENT
    if v.verdict in ("refuted", "vacuous"):
        return NOT_EQUIVALENT
    return INCONCLUSIVE


def exit_code(verdicts: list[RuleVerdict]) -> int:
    codes = {EXIT_CODES[lattice(v)] for v in verdicts}
    return max(codes, key=lambda c: (c == 1, c == 3)) if codes else 0


def check_rules(
    rules: list[Rule] | None = None, limit_s: float = 10.0
) -> tuple[list[RuleVerdict], int]:
    verdicts = [prove(r, limit_s) for r in (rules if rules is not None else list(RULES.values()))]
    return verdicts, exit_code(verdicts)


def verdict_json(v: RuleVerdict) -> dict[str, Any]:
    return {**v.to_json(), "prover": v.verdict, "verdict": lattice(v)}


def write_certificate(verdicts: list[RuleVerdict], path: str = CERT_PATH) -> None:
    data: dict[str, Any] = {"schema_version": 1, "rules": {}}
    for v in verdicts:
        data["rules"][v.rule] = {
            "fingerprint": RULES[v.rule].fingerprint,
            "verdict": v.verdict,
            "tag": v.tag,
        }
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def check_mutants(
    rules: list[Rule] | None = None, per_rule: int = 3, limit_s: float = 2.0, rotate: bool = False
) -> dict[str, Any]:
    """Prove `per_rule` mutants of each rule's rhs; every one must be refused (not proved) or be
    listed in `mutants.EQUIVALENT` with its reason."""
    from llmir_core.rewrite.mutants import equivalent_because, sample

    rows: list[dict[str, Any]] = []
    for i, r in enumerate(rules if rules is not None else list(RULES.values())):
        for m in sample(r, per_rule, i if rotate else 0):
            v = prove(m.rule, limit_s, dtype_checks=False)
            refused = v.verdict != "proved"
            reason = equivalent_because(r.name, m.description)
            rows.append(
                {
                    "rule": r.name,
                    "mutant": m.description,
                    "prover": v.verdict,
                    "verdict": lattice(v),
                    "refused": refused,
                    "equivalent_because": reason,
                    "seconds": round(v.seconds, 3),
                }
            )
    survived = [x for x in rows if not x["refused"]]
    unexplained = [x for x in survived if not x["equivalent_because"]]
    return {
        "generated": len(rows),
        "refused": len(rows) - len(survived),
        "refuted": sum(x["prover"] == "refuted" for x in rows),
        "survived_equivalent": len(survived) - len(unexplained),
        "survived_unexplained": len(unexplained),
        "rules": len({x["rule"] for x in rows}),
        "mutants": rows,
    }
