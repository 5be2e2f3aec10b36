"""Interval analysis, fp16 overflow and `verify_invariant` expressions."""

from __future__ import annotations

import pytest

from llmir_core.ir.parser import parse_module
from llmir_core.smt.intervals import InvariantSyntaxError, analyze, check_invariant, parse_invariant

H = "tensor<1x2x3x4xf16>"
TEXT = f"""module @m attributes {{llmir.dialects = ["core", "llm"], llmir.version = "0.1"}} {{
  func.func @main(%q: {H}, %k: {H}, %v: {H}) -> {H} {{
    %o = llm.scaled_dot_product_attention %q, %k, %v {{causal = true}} : ({H}, {H}, {H}) -> {H}
    %e = core.exp %o : ({H}) -> {H}
    return %e : {H}
  }}
}}
"""


def test_fp16_overflow_excluded_for_small_inputs_but_not_large() -> None:
    m = parse_module(TEXT, "a.llmir")
    small = analyze(m, (-1.0, 1.0))
    assert not small.f16_risks and small.f16_values == 2
    assert small.outputs[0][1] == pytest.approx(2.718281828)
    large = analyze(m, (-20.0, 20.0))
    assert large.f16_risks and "%e (core.exp at a.llmir:4:10)" in large.f16_risks[0]


def test_invariants_by_smt_and_intervals() -> None:
    m = parse_module(TEXT)
    rep = analyze(m)
    attn = m.main.ops[0]
    r = check_invariant("sum(softmax(scores), -1) == 1.0 +- 1e-6", attn, rep)
    assert r["verdict"] == "proved" and r["method"] == "smt"
    r = check_invariant("max(abs(output)) <= 1.0", attn, rep)
    assert r["verdict"] == "proved" and r["method"] == "intervals"
    r = check_invariant("min(output) > 5", attn, rep)
    assert r["verdict"] == "violated"


@pytest.mark.parametrize(
    "text,col,msg",
    [
        ("sum(output) ==", 15, "unexpected 'end of text'"),
        ("sum(output) ~ 1", 13, "unexpected character '~'"),
        ("median(output) == 1", 1, "unknown function 'median'"),
        ("sum(output)", 12, "expected a comparison"),
    ],
)
def test_invariant_syntax_errors_are_located(text: str, col: int, msg: str) -> None:
    with pytest.raises(InvariantSyntaxError) as e:
        parse_invariant(text)
    assert e.value.col + 1 == col and msg in e.value.message
