"""lower-triton is a conversion-pattern table run by the rewrite engine: each conversion is
logged as a rule instance named after its row, the legal set decides which rows may apply, and a
row that does not apply says why (its op stays)."""

from __future__ import annotations

from pathlib import Path

from llmir_core.ir.parser import parse_module
from llmir_core.passes.base import PassContext
from llmir_core.passes.rewriting import apply_conversions
from llmir_core.targets.triton.lower import LowerTriton

CASES = Path(__file__).resolve().parents[1] / "filecheck" / "passes"


def _module():  # type: ignore[no-untyped-def]
    text = (CASES / "lower-triton.llmir").read_text()
    return parse_module(text, str(CASES / "lower-triton.llmir"))


def test_each_conversion_is_a_logged_rule_instance() -> None:
    m, ctx = _module(), PassContext()
    assert LowerTriton().run(m, ctx)
    rules = {i.rule for i in ctx.instances}
    assert {"lower-triton.embedding", "lower-triton.attention", "lower-triton.kv_append"} <= rules
    converted = [op for op in m.main.ops if op.name.startswith("triton.")]
    assert len(ctx.instances) == len([op for op in converted if op.name != "triton.gated_matmul"])
    emb = next(i for i in ctx.instances if i.rule == "lower-triton.embedding")
    assert emb.attrs == {"block_h": 64} and list(emb.bindings) == ["x0", "x1"]


def test_only_legal_targets_apply() -> None:
    """With triton.attention outside the legal set the attention stays, with the reason."""
    m, ctx = _module(), PassContext()
    table = LowerTriton().table()
    assert apply_conversions(m, ctx, table, lambda name: name != "triton.attention")
    names = {op.name for op in m.main.ops}
    assert "llm.scaled_dot_product_attention" in names and "triton.attention" not in names
    assert any("triton.attention is not legal" in r.reason for r in ctx.rejections)


def test_a_row_that_does_not_apply_says_why() -> None:
    text = (CASES / "lower-triton.negative_unsupported.llmir").read_text()
    m, ctx = parse_module(text, "neg.llmir"), PassContext()
    LowerTriton(kv_cache="int8").run(m, ctx)
    reasons = {r.rule: r.reason for r in ctx.rejections}
    assert "mask" in reasons["lower-triton.attention"]
    assert "transpose_b" in reasons["lower-triton.matmul"]
