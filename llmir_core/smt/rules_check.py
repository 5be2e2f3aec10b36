"""`llmir verify --rules`: prove the whole rule library and (optionally) write the certificate
the passes read."""

from __future__ import annotations

import json
from typing import Any

from llmir_core.fileio import write_text_atomic
from llmir_core.rewrite.library import CERT_PATH, RULES
from llmir_core.rewrite.rule import Rule

from .prove import RuleVerdict, prove

EXIT_FOR = {"proved": 0, "refuted": 1, "vacuous": 1}


def check_rules(
    rules: list[Rule] | None = None, limit_s: float = 10.0
) -> tuple[list[RuleVerdict], int]:
    verdicts = [prove(r, limit_s) for r in (rules if rules is not None else list(RULES.values()))]
    codes = [EXIT_FOR.get(v.verdict, 3) for v in verdicts]
    code = 1 if 1 in codes else (3 if 3 in codes else 0)
    return verdicts, code


def write_certificate(verdicts: list[RuleVerdict], path: str = CERT_PATH) -> None:
    data: dict[str, Any] = {"schema_version": 1, "rules": {}}
    for v in verdicts:
        data["rules"][v.rule] = {
            "fingerprint": RULES[v.rule].fingerprint,
            "verdict": v.verdict,
            "tag": v.tag,
        }
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
