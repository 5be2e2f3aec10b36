"""The -O3 lifting and fusion passes (lift-layer-norm, lift-rotary, lift-attention,
fuse-add-rms-norm, fuse-linear), their fused ops, their rules' proofs and mutants."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from llmir_core.builder import Builder, new_module
from llmir_core.dialects.registry import get_op
from llmir_core.interp import run
from llmir_core.ir.core import Function
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import DType, TensorType
from llmir_core.passes import PASSES, PRESETS
from llmir_core.passes.base import clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.passes.pipeline import parse_pipeline, preset
from llmir_core.rewrite import fusion_rules
from llmir_core.rewrite.library import RULES, is_proved
from llmir_core.rewrite.proof_obligations import equality
from llmir_core.rewrite.terms import A, T, V, t
from llmir_core.smt.differential import compare, make_inputs
from llmir_core.smt.prove import prove
from llmir_core.smt.tv import validate, validate_pass
from llmir_core.verifier import verify
from tests.passes.decoder import TINY, build_decoder
from tests.passes.exported import exported_block

NEW = ("lift-layer-norm", "lift-rotary", "lift-attention", "fuse-add-rms-norm", "fuse-linear")


def _run_op(name: str, args: list[np.ndarray], **attrs: Any) -> list[np.ndarray]:
    """The op's reference and its decomposition, on the same inputs."""
    m = new_module("t", ("core", "llm"))
    fn = Function("main", [])
    m.functions.append(fn)
    b = Builder(fn)
    vals = [b.arg(f"a{i}", TensorType(a.shape, DType.f32)) for i, a in enumerate(args)]
    op = b.create(name, vals, attrs)
    b.ret(*op.results)
    ref = run(m, {f"a{i}": a for i, a in enumerate(args)})
    d = new_module("d", ("core", "llm"))
    fd = Function("main", [])
    d.functions.append(fd)
    bd = Builder(fd)
    dv = [bd.arg(f"a{i}", TensorType(a.shape, DType.f32)) for i, a in enumerate(args)]
    od = get_op(name)
    assert od is not None and od.decompose is not None
    bd.ret(*od.decompose(bd, dv, od.with_defaults(attrs)))
    dec = run(d, {f"a{i}": a for i, a in enumerate(args)})
    for r, x in zip(ref, dec):
        np.testing.assert_allclose(r, x, rtol=2e-5, atol=2e-6)
    return ref


def test_add_rms_norm_reference_by_hand() -> None:
    rng = np.random.default_rng(0)
    x, r, w = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 8), (2, 3, 8), (8,)))
    y, s = _run_op("llm.add_rms_norm", [x, r, w], eps=1e-5, offset=1.0)
    want_s = x + r
    want_y = (
        want_s
        / np.sqrt((want_s.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
        * (w + 1.0)
    )
    np.testing.assert_array_equal(s, want_s)
    np.testing.assert_allclose(y, want_y, rtol=1e-6)


@pytest.mark.parametrize("act", ["none", "silu", "gelu", "gelu_tanh", "relu"])
def test_linear_reference_by_hand(act: str) -> None:
    rng = np.random.default_rng(1)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 8), (5, 8), (5,)))
    (y,) = _run_op("llm.linear", [x, w, bias], activation=act)
    z = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    want = {
        "none": z,
        "relu": np.maximum(z, 0),
        "silu": z / (1 + np.exp(-z)),
        "gelu": 0.5 * z * (1 + np.vectorize(__import__("math").erf)(z / np.sqrt(2))),
        "gelu_tanh": 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3))),
    }[act]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    (y2,) = _run_op("llm.linear", [x, w.T.copy()], activation=act, transpose_b=False)
    np.testing.assert_allclose(y2, _run_op("llm.linear", [x, w], activation=act)[0], rtol=1e-6)


def test_O3_lifts_an_exported_block_and_validates_each_pass() -> None:
    m = exported_block()
    original = clone_module(m)
    res = run_pipeline(m, preset(3), validator=validate_pass)
    assert res.failed_validation is None
    assert all(r.validation and r.validation["verdict"] == "equivalent" for r in res.runs)
    c = res.after.op_counts
    assert c["llm.layer_norm"] == 1 and c["llm.rotary_embedding"] == 2
    assert (
        c["llm.scaled_dot_product_attention"] == 1
        and c["llm.linear"] == 3
        and c["llm.add_rms_norm"] == 1
    )
    for gone in (
        "core.softmax",
        "core.trilu",
        "core.tile",
        "core.gather",
        "core.reduce_mean",
        "core.gelu",
    ):
        assert gone not in c, gone
    sdpa = next(op for op in m.main.ops if op.name == "llm.scaled_dot_product_attention")
    assert (
        sdpa.attrs["causal"] is True and sdpa.operands[1].type.shape[1] == 2
    )  # GQA: un-repeated k
    assert res.after.ops < res.before.ops / 2 and not verify(m)
    assert compare(original, m).get("agree")
    # without the passes' rule instances the lifted patterns cannot be matched: SMT shows
    # nothing, and outputs that agree on a few inputs are evidence, not a proof
    whole = validate(original, m)
    assert whole["verdict"] == "inconclusive" and whole["agree"], whole
    inputs = make_inputs(original, {"batch": 2, "seq": 5}, seed=3, scale=1.0)
    inputs["pos"] = np.tile(np.arange(5), (2, 1)).astype(np.int64)
    np.testing.assert_allclose(run(m, inputs)[0], run(original, inputs)[0], rtol=1e-4, atol=1e-5)


def test_O3_differs_from_O2_on_the_decoder() -> None:
    # fuse-add-rms-norm moved to -O2 (it fires on every fresh import)
    assert set(PRESETS["O3"]) - set(PRESETS["O2"]) == set(NEW) - {"fuse-add-rms-norm"}
    m2, m3 = build_decoder(TINY), build_decoder(TINY)
    r2, r3 = run_pipeline(m2, preset(2)), run_pipeline(m3, preset(3), validator=validate_pass)
    assert r3.failed_validation is None
    # the post-attention norm of each layer and the next layer's input norm read residual adds
    assert (
        r2.after.op_counts["llm.add_rms_norm"]
        == r3.after.op_counts["llm.add_rms_norm"]
        == 2 * TINY.layers - 1
    )
    e2, e3 = run_pipeline(exported_block(), preset(2)), run_pipeline(exported_block(), preset(3))
    assert e3.after.ops < e2.after.ops  # -O3 lifts the exported attention, rotary and LayerNorm


def test_new_passes_are_idempotent_and_listed() -> None:
    for name in NEW:
        assert name in PASSES and PASSES[name].summary
    m = exported_block()
    run_pipeline(m, preset(3))
    once = print_module(m)
    run_pipeline(m, preset(3))
    assert print_module(m) == once


_SHARED = """module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {
  func.func @main(%x: tensor<?b x 8 x f32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>) -> (tensor<?b x 16 x f32>, tensor<?b x 16 x f32>) {
    %p = core.matmul %x, %w {transpose_b = true} : (tensor<?b x 8 x f32>, tensor<16x8xf32>) -> tensor<?b x 16 x f32>
    %y = core.add %p, %b : (tensor<?b x 16 x f32>, tensor<16xf32>) -> tensor<?b x 16 x f32>
    %z = core.relu %p : (tensor<?b x 16 x f32>) -> tensor<?b x 16 x f32>
    return %y, %z : tensor<?b x 16 x f32>, tensor<?b x 16 x f32>
  }
}
"""


@pytest.mark.parametrize("shared", [True, False])
def test_fusion_keeps_a_shared_product(shared: bool) -> None:
    """x @ w^T + b fuses into llm.linear only when nothing else reads the product: with a second
    use the matmul would stay for it and run twice."""
    from llmir_core.ir.parser import parse_module

    text = _SHARED if shared else _SHARED.replace("%z = core.relu %p", "%z = core.relu %y")
    m = parse_module(text, "shared.llmir")
    res = run_pipeline(m, parse_pipeline("fuse-linear"))
    counts = res.after.op_counts
    if shared:
        assert not res.ctx.rewrites and counts["core.matmul"] == 1 and "llm.linear" not in counts
        # both candidates, x @ w^T + b and relu(x @ w^T), are refused for the same reason
        assert {(r.rule, r.reason) for r in res.ctx.rejections} == {
            ("linear-bias", "%p is also used outside the pattern"),
            ("linear-relu", "%p is also used outside the pattern"),
        }
    else:
        assert [r.rule for r in res.ctx.rewrites] == ["linear-bias"]
        assert counts["llm.linear"] == 1 and "core.matmul" not in counts


@pytest.mark.parametrize("name", sorted(n for n, r in RULES.items() if set(r.passes) & set(NEW)))
def test_rules_are_certified(name: str) -> None:
    assert is_proved(RULES[name])


def _mut(name: str, **changes: Any) -> Any:
    """A wrong variant of a rule, with the obligation rebuilt for its new sides."""
    kw = changes.pop("proof", {})
    r = dataclasses.replace(RULES[name], name=f"mutant-{name}", **changes)
    return dataclasses.replace(r, obligation=equality(r.lhs, r.rhs, r.sig, r.batch_ranks, **kw))


ROT = RULES["lift-rotary"]
MUTANTS = {
    # the sum result is the normalized one
    "add-rms-norm-wrong-result": _mut(
        "fuse-add-rms-norm-sum",
        rhs=T(
            "llm.add_rms_norm",
            RULES["fuse-add-rms-norm"].rhs.args,
            RULES["fuse-add-rms-norm"].rhs.attrs,
            0,
        ),
    ),
    # the activation is lost
    "linear-drops-activation": _mut(
        "linear-bias-silu",
        rhs=t("llm.linear", V("x"), V("w"), V("b"), activation="none", transpose_b=True),
    ),
    # transpose_b flipped: w used as [in, out]
    "linear-transposed-weight": _mut(
        "linear-silu",
        rhs=t("llm.linear", V("x"), V("w"), activation="silu", transpose_b=False),
        sig={"x": "... m k", "w": "k k"},
    ),
    # the bias is dropped from the lifted LayerNorm
    "layer-norm-drops-bias": _mut(
        "lift-layer-norm-mul-rsqrt",
        rhs=t("llm.layer_norm", V("x"), V("w"), eps=A("eps")),
        proof={"assume": lambda s: [s["eps"] > 0], "proof_attrs": fusion_rules.layer_norm_attrs},
    ),
    # sin and cos swapped in the lifted rotary
    "rotary-swaps-tables": _mut(
        "lift-rotary",
        rhs=T(
            "llm.rotary_embedding",
            (ROT.rhs.args[0], ROT.rhs.args[2], ROT.rhs.args[1], ROT.rhs.args[3]),
            ROT.rhs.attrs,
        ),
        proof={
            "proof_attrs": fusion_rules.rotary_attrs,
            "int_leaves": ("pos",),
            "hyps_at": fusion_rules.rotary_hyps,
        },
    ),
    # the tables' halves are not assumed to repeat (the pass's data precondition dropped)
    "rotary-without-precondition": _mut(
        "lift-rotary", proof={"proof_attrs": fusion_rules.rotary_attrs, "int_leaves": ("pos",)}
    ),
}


@pytest.mark.parametrize("key", sorted(MUTANTS))
def test_wrong_fusion_rule_is_refuted(key: str) -> None:
    v = prove(MUTANTS[key], limit_s=10)
    assert v.verdict == "refuted", (key, v.verdict, v.detail)
