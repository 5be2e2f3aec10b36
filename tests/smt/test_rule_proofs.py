"""Rules are proved about their own lhs and rhs: exact rules equal, approximate rules within the
error bound they state (rounding explicit); mutants of the rhs are refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmir_core.ir.types import DType, QuantType
from llmir_core.passes.quantize_weights import quantize_matrix
from llmir_core.quant import quantize
from llmir_core.rewrite.bounds import ErrorBound
from llmir_core.rewrite.library import RULES
from llmir_core.rewrite.mutants import mutants
from llmir_core.rewrite.terms import A, V, t
from llmir_core.smt.prove import prove
from llmir_core.smt.rules_check import check_mutants, lattice
from llmir_core.weights import PackedArray


def _verdict(rule_name: str, **changes: object) -> tuple[str, str]:
    r = RULES[rule_name]
    if changes:
        r = dataclasses.replace(r, name=f"mutant-{rule_name}", **changes)  # type: ignore[arg-type]
    v = prove(r, 10)
    return v.verdict, lattice(v)


def test_exact_and_approximate_rules_speak_the_lattice() -> None:
    assert _verdict("neg-neg") == ("proved", "equivalent")
    v = prove(RULES["precision-core-add"], 10)
    assert (v.verdict, lattice(v)) == ("proved", "within-bound")
    assert v.bound.startswith("|rhs - lhs| <=")
    assert _verdict("quantize-weights-int4-asym-matmul-kn") == ("proved", "within-bound")
    assert _verdict("kv-cache-int8") == ("proved", "within-bound")
    assert _verdict("cast-roundtrip-bf16") == ("proved", "equivalent")


def test_the_two_named_mutants_are_refused() -> None:
    # the examples: both were "proved" while the obligation was a generic lemma
    cast_sum = t("core.cast", t("core.add", V("a0"), V("a0")), to=A("__back"))
    assert _verdict("precision-core-matmul-reorder-nk", rhs=cast_sum)[1] == "not-equivalent"
    assert _verdict("quantize-weights-int8-sym-matmul", rhs=t("core.neg", V("x")))[1] == (
        "not-equivalent"
    )


def test_a_bound_too_tight_is_refused() -> None:
    r = RULES["precision-core-neg"]
    tight = dataclasses.replace(r, name="tight", bound=ErrorBound(rel=2.0**-12))
    assert prove(tight, 10).verdict == "refuted"
    # the bound is part of the proved statement
    assert tight.fingerprint != r.fingerprint


def test_an_obligation_about_other_terms_is_not_accepted() -> None:
    r = RULES["fuse-add-rms-norm"]
    other = dataclasses.replace(r, name="other", rhs=RULES["fuse-add-rms-norm-sum"].rhs)
    assert prove(other, 10).verdict == "unproved"


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_quantization_premise_on_real_codes(symmetric: bool) -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 64)).astype(np.float32)
    q = quantize_matrix(w, 4, 32, symmetric)  # the quantize-weights pass's quantizer
    packed = PackedArray(q.codes, q.qtype, q.shape)
    scales, zp = q.scales, q.zeros
    name = f"quantize-weights-int4-{'sym' if symmetric else 'asym'}-matmul"
    check = RULES[name].numeric_check
    assert check is not None
    arrays = {"w": w, "wq": packed, "ws": scales, "wz": zp}
    assert check(arrays) is None
    assert RULES[name + "-kn"].numeric_check({**arrays, "w": w.T}) is None  # type: ignore[misc]
    # corrupted codes: flip bits of one byte, the weight is no longer within half a step
    bad = dataclasses.replace(packed, data=packed.data.copy())
    bad.data[3] ^= 0x77
    why = check({**arrays, "wq": bad})
    assert why is not None and "from its dequantized code" in why
    # a weight moved by a whole step
    assert check({**arrays, "w": w + np.abs(scales).max() * 2}) is not None


def test_the_premise_catches_a_clamping_quantizer() -> None:
    """nbits' own symmetric quantizer maps the largest magnitude to code -8: a positive weight of
    that magnitude clamps at +7, a whole step away. The premise says so (the pass does not use it)."""
    w = np.zeros((1, 32), np.float32)
    w[0, 0], w[0, 1] = -1.0, 1.0
    packed, scales, zp = quantize(w, QuantType("nbits", 4, 32, DType.f32, "none"))
    check = RULES["quantize-weights-int4-sym-matmul"].numeric_check
    assert check is not None
    assert "from its dequantized code" in (check({"w": w, "wq": packed, "ws": scales}) or "")


def test_every_rule_has_three_mutants() -> None:
    assert all(len(mutants(r)) >= 3 for r in RULES.values())


def test_one_mutant_of_every_rule_is_refused() -> None:
    """The suite's sample: one mutant per rule, the operator rotating by rule; the full run
    (`llmir verify --rules --mutants`, 3 per rule) is on demand."""
    rep = check_mutants(list(RULES.values()), per_rule=1, limit_s=2.0, rotate=True)
    assert rep["rules"] == len(RULES) and rep["generated"] == len(RULES)
    survivors = [(m["rule"], m["mutant"]) for m in rep["mutants"] if not m["refused"]]
    assert rep["survived_unexplained"] == 0, survivors
    assert rep["refuted"] > len(RULES) // 2


def test_mutants_cli_reports_counts(tmp_path: object) -> None:
    from tests.conftest import run_cli

    r = run_cli("verify", "--rules", "--mutants", "--rule", "neg-neg", "--format", "json")
    assert r.returncode == 0, r.stderr
    import json

    data = json.loads(r.stdout)
    assert data["generated"] == 3 and data["refused"] == 3 and data["survived_unexplained"] == 0
    r = run_cli("verify", "--rules", "--mutants", "--rule", "neg-neg")
    assert "3 mutants of 1 rules: 3 refused" in r.stdout
