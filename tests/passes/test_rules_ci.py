"""CI proves the whole rewrite library with `llmir verify --rules`: every rule equivalent or within
its stated bound, except the approximate rules listed as unproved (not applied by default)."""

from __future__ import annotations

import json

from llmir_core.rewrite.library import RULES, is_proved
from tests.conftest import run_cli

# approximate rules whose bound is not proved here (issue 21); the passes do not apply them
UNPROVED = {n for n in RULES if "gated-mlp" in n and n.startswith("quantize-weights")}
UNPROVED |= {n for n in RULES if n.startswith("nbits-") and ("swiglu" in n or "gated-mlp" in n)}
UNPROVED |= {
    "precision-llm-gated-mlp",
    "precision-llm-scaled-dot-product-attention-3",
    "precision-llm-scaled-dot-product-attention-4",
    "precision-llm-quantized-matmul-2",
    "precision-llm-silu-mul",
}


def test_every_rule_is_proved_or_listed_unproved() -> None:
    r = run_cli("verify", "--rules", "--format", "json")
    assert r.returncode == 3, r.stderr  # inconclusive: the unproved rules
    rules = json.loads(r.stdout)["rules"]
    assert len(rules) >= 100
    bad = {x["rule"] for x in rules if x["verdict"] not in ("equivalent", "within-bound")}
    assert bad == UNPROVED
    for x in rules:
        assert (x["verdict"] == "within-bound") == (
            x["tag"] == "approximate" and x["rule"] not in UNPROVED
        )
        if x["verdict"] == "within-bound":
            assert x["bound"].startswith("|rhs - lhs| <=")
    # the certificate in the tree is current: every proved rule is applied, no unproved one
    assert all(is_proved(RULES[x["rule"]]) == (x["rule"] not in UNPROVED) for x in rules)
    slow = [(x["rule"], x["seconds"]) for x in rules if x["seconds"] >= 60.0]
    assert not slow, slow
