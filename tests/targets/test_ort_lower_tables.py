"""lower-ort-norms is a conversion-pattern table run by the rewrite engine: each conversion is
logged as a rule instance named after its row, and a target op outside the onnxruntime target's
capabilities (the legal set) is refused, its op staying with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmir_core.ir.core import Module
from llmir_core.ir.parser import parse_module
from llmir_core.passes.base import PassContext
from llmir_core.passes.rewriting import Conversion, Converted, apply_conversions
from llmir_core.targets.onnxruntime import lower_common, lower_norms
from llmir_core.targets.onnxruntime.lower_embedding import LowerOrtEmbedding
from llmir_core.targets.onnxruntime.lower_norms import PLAIN, SKIP, LowerOrtNorms

CASE = Path(__file__).resolve().parents[1] / "filecheck" / "passes" / "lower-ort-norms.llmir"


def _module() -> Module:
    return parse_module(CASE.read_text(), str(CASE))


def _names(m: Module) -> list[str]:
    return [op.name for op in m.main.ops]


def test_each_conversion_is_a_logged_rule_instance() -> None:
    m, ctx = _module(), PassContext()
    assert LowerOrtNorms(norm_kernel="llmir").run(m, ctx)
    rules = [i.rule for i in ctx.instances]
    assert rules == [
        "lower-ort-norms.simplified_layer_norm",
        "lower-ort-norms.skip_simplified_layer_norm",
        "lower-ort-norms.skip_simplified_layer_norm",
    ]
    assert _names(m).count(SKIP) == 2 and "core.add" not in _names(m)
    skip = ctx.instances[1]
    assert list(skip.bindings.values()) == [
        "embeddings",
        "v18",
        "model.layers.0.post_attention_layernorm.weight",
    ]
    assert skip.attrs == {"epsilon": 1e-05, "offset": 0.0, "kernel": "llmir"}
    assert ctx.instances[0].root == "v"


def test_a_target_op_outside_the_capabilities_is_refused() -> None:
    """The pass's legal set is the onnxruntime capabilities: a triton op is not in it."""
    assert lower_common.legal(PLAIN) and lower_common.legal(SKIP)
    assert not lower_common.legal("triton.rms_norm")
    m, ctx = _module(), PassContext()
    row = Conversion("to-triton", "llm.rms_norm", "triton.rms_norm", lambda fn, op: Converted({}))
    assert not apply_conversions(m, ctx, [row], lower_common.legal)
    assert "triton.rms_norm" not in _names(m)
    assert all("triton.rms_norm is not legal" in r.reason for r in ctx.rejections)


def test_the_pass_keeps_to_its_legal_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the skip norm in the legal set every norm becomes the plain one."""
    monkeypatch.setattr(lower_norms, "legal", lambda name: name != SKIP)
    m, ctx = _module(), PassContext()
    assert LowerOrtNorms().run(m, ctx)
    assert _names(m).count(PLAIN) == 3 and SKIP not in _names(m)
    assert any(f"{SKIP} is not legal" in r.reason for r in ctx.rejections)


def test_the_embedding_row_logs_its_conversion() -> None:
    """A lookup in the tied head's blocks is one logged conversion; an f32 table in an f32
    build stays a plain lookup, with the reason."""
    text = (CASE.parent / "lower-ort-embedding.llmir").read_text().split("// -----")[0]
    m, ctx = parse_module(text, "tied.llmir"), PassContext()
    assert LowerOrtEmbedding().run(m, ctx)
    assert "ort.gather_block_quantized" in _names(m) and "llm.embedding" not in _names(m)
    (inst,) = ctx.instances
    assert inst.rule == "lower-ort-embedding.gather_block_quantized"
    assert inst.attrs["quantize"] == "none" and len(inst.bindings) == 2
    neg = CASE.parent / "lower-ort-embedding.negative_f32_build.llmir"
    m, ctx = parse_module(neg.read_text(), str(neg)), PassContext()
    assert not LowerOrtEmbedding().run(m, ctx) and not ctx.instances
    assert "llm.embedding" in _names(m)
    assert any("not stored in blocks" in r.reason for r in ctx.rejections)
