"""The mutation suite: deliberately wrong rules and pass bugs, each caught by the rule prover
(`verify --rules`: refuted, with a counterexample replayed in numpy) or by translation
validation (not equivalent, naming the pass and the first differing value)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from llmir_core.ir.parser import parse_module
from llmir_core.passes import PASSES
from llmir_core.passes.base import PassContext, erase_dead, is_pure
from llmir_core.passes.manager import run_pipeline
from llmir_core.rewrite.library import RULES
from llmir_core.rewrite.terms import A, C, V, t
from llmir_core.smt.prove import prove
from llmir_core.smt.tv import validate_pass


def _mut(name: str, **changes: Any) -> Any:
    return dataclasses.replace(RULES[name], name=f"mutant-{name}", **changes)


RULE_MUTANTS = {
    # transposed operand: the transpose is dropped instead of folded into transpose_b
    "transposed-operand": _mut("matmul-transpose-b", rhs=t("core.matmul", V("a"), V("b"))),
    # wrong eps: the lifted norm uses a fixed 1e-6 instead of the pattern's eps
    "wrong-eps": _mut("lift-rms-norm-mul-rsqrt", rhs=t("llm.rms_norm", V("x"), V("w"), eps=1e-6)),
    # dropped scale: the weight multiplication is lost
    "dropped-scale": _mut(
        "lift-rms-norm-mul-rsqrt",
        rhs=t("llm.rms_norm", V("x"), V("w"), eps=A("eps")).__class__(
            "llm.rms_norm", (V("x"), V("w")), {"eps": A("eps"), "offset": 1.0}
        ),
    ),
    # reduction over the wrong axis: mean over -2 lifted as a last-axis norm
    "wrong-axis": _mut(
        "lift-rms-norm-mul-rsqrt",
        proof_attrs=lambda b: {"axes": (-2,), "keepdims": True},
        batch_ranks=(1,),
    ),
    # multiplying by c is only x when c == 1: the assumption is dropped
    "mul-any-constant": _mut("mul-one", assume=None),
    "neg-neg-to-neg": _mut("neg-neg", rhs=t("core.neg", V("x"))),
    "sub-zero-left": _mut("sub-zero", lhs=t("core.sub", C("c"), V("x"))),
    "div-one-left": _mut("div-one", lhs=t("core.div", C("c"), V("x"))),
    "swapped-silu-mul": _mut("fuse-silu-mul", rhs=t("llm.silu_mul", V("u"), V("g"))),
    "swapped-gate-up": _mut(
        "fuse-gated-mlp", rhs=t("llm.gated_mlp", V("x"), V("wu"), V("wg"), V("wd"))
    ),
    "non-inverse-perms": _mut(
        "transpose-transpose",
        sig={"x": "... m n k"},
        proof_attrs=lambda b: {"p1": (1, 2, 0), "p2": (1, 2, 0)},
        batch_ranks=(0,),
    ),
    "qkv-sizes-swapped": _mut("merge-qkv-k", proof_attrs=lambda b: {"sizes": ("k", "q", "v")}),
    "silu-missing-x": _mut("lift-silu", rhs=t("core.sigmoid", V("x"))),
    # the precision rule's rhs replaced by a cast of a0 + a0 (issue 21): the bound fails
    "precision-cast-sum": _mut(
        "precision-core-matmul-reorder-nk",
        rhs=t("core.cast", t("core.add", V("a0"), V("a0")), to=A("__back")),
    ),
}


@pytest.mark.parametrize("key", sorted(RULE_MUTANTS))
def test_wrong_rule_is_refuted(key: str) -> None:
    v = prove(RULE_MUTANTS[key], limit_s=3)
    assert v.verdict == "refuted", (key, v.verdict, v.detail)
    if RULE_MUTANTS[key].obligation is None and RULE_MUTANTS[key].bound is None:
        cex = v.counterexample
        assert cex is not None and cex["max_abs_diff"] > 0 and "inputs" in cex and "dims" in cex
    else:
        assert v.counterexample  # the model: x and amax that overflow


# -- pass bugs, caught by translation validation ------------------------------------------------

KV = "!llm.kv_cache<layers=1, kv_heads=2, max_len=8, head_dim=4, dtype=f32>"
CACHE = f"""module @m attributes {{llmir.dialects = ["core", "llm"], llmir.version = "0.1"}} {{
  func.func @main(%c0: {KV}, %k: tensor<1x2x3x4xf32>, %v: tensor<1x2x3x4xf32>, %start: tensor<i64>) -> {KV} {{
    %c1 = llm.kv_cache_update %c0, %k, %v, %start {{layer = 0}} : ({KV}, tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>, tensor<i64>) -> {KV} loc("hf:model.layers.0.self_attn")
    return %c1 : {KV}
  }}
}}
"""
T = "tensor<?b x 4 x f32>"
GELU = f"""module @m attributes {{llmir.dialects = ["core"], llmir.version = "0.1"}} {{
  func.func @main(%x: {T}) -> {T} {{
    %a = core.gelu %x {{approximate = "none"}} : ({T}) -> {T}
    %b = core.gelu %x {{approximate = "tanh"}} : ({T}) -> {T}
    %y = core.sub %a, %b : ({T}, {T}) -> {T} loc("hf:model.mlp.act")
    return %y : {T}
  }}
}}
"""
FOLD = f"""module @m attributes {{llmir.dialects = ["core"], llmir.version = "0.1"}} {{
  func.func @main(%x: {T}) -> {T} {{
    %a = core.constant {{value = dense<1.0> : tensor<f32>}} : () -> tensor<f32>
    %b = core.constant {{value = dense<2.0> : tensor<f32>}} : () -> tensor<f32>
    %c = core.add %a, %b : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %y = core.mul %x, %c : ({T}, tensor<f32>) -> {T}
    return %y : {T}
  }}
}}
"""
Q = "tensor<1x2x3x4xf32>"
ATTN = f"""module @m attributes {{llmir.dialects = ["core", "llm"], llmir.version = "0.1"}} {{
  func.func @main(%q: {Q}, %k: {Q}, %v: {Q}) -> {Q} {{
    %o = llm.scaled_dot_product_attention %q, %k, %v {{causal = true}} : ({Q}, {Q}, {Q}) -> {Q} loc("hf:model.layers.0.self_attn")
    return %o : {Q}
  }}
}}
"""


@dataclass(frozen=True)
class DceDropsCacheWrite:
    """Bug: treats the cache update as dead and returns the old cache."""

    name: ClassVar[str] = "dce"

    def run(self, module: Any, ctx: PassContext) -> bool:
        fn = module.main
        for op in list(fn.ops):
            if op.name == "llm.kv_cache_update":
                fn.outputs = [op.operands[0] if v is op.results[0] else v for v in fn.outputs]
                fn.ops.remove(op)
                return True
        return False


@dataclass(frozen=True)
class CseIgnoresAttrs:
    """Bug: the CSE key leaves out attributes."""

    name: ClassVar[str] = "cse"

    def run(self, module: Any, ctx: PassContext) -> bool:
        fn = module.main
        seen: dict[Any, Any] = {}
        changed = False
        for op in fn.ops:
            op.operands = [seen.get(id(v), v) for v in op.operands]
            key = (op.name, tuple(id(v) for v in op.operands))
            if is_pure(op) and key in seen.get("keys", {}):
                seen[id(op.results[0])] = seen["keys"][key]
                changed = True
            else:
                seen.setdefault("keys", {})[key] = op.results[0]
        fn.outputs = [seen.get(id(v), v) for v in fn.outputs]
        erase_dead(fn)
        return changed


@dataclass(frozen=True)
class FoldsAddAsSub:
    """Bug: constant folding evaluates add as subtraction."""

    name: ClassVar[str] = "constant-fold"

    def run(self, module: Any, ctx: PassContext) -> bool:
        import numpy as np

        from llmir_core.ir.attrs import DenseAttr

        fn = module.main
        for op in fn.ops:
            if op.name == "core.add" and all(
                v.owner and v.owner.name == "core.constant" for v in op.operands
            ):
                a, b = (v.owner.attrs["value"].array for v in op.operands)
                old = op.results[0]
                op.name, op.operands, op.attrs = (
                    "core.constant",
                    [],
                    {"value": DenseAttr(np.asarray(a - b))},
                )
                from llmir_core.rewrite.rule import RuleInstance

                ctx.instances.append(
                    RuleInstance("constant-fold", old.name, old.name, {}, {}, {}, "")
                )
                return True
        return False


@dataclass(frozen=True)
class DropsCausal:
    """Bug: rewrites attention without its causal mask (a wrong causal offset)."""

    name: ClassVar[str] = "fuse-attention"

    def run(self, module: Any, ctx: PassContext) -> bool:
        for op in module.main.ops:
            if op.name == "llm.scaled_dot_product_attention" and op.attrs.get("causal"):
                op.attrs = {**op.attrs, "causal": False}
                return True
        return False


@dataclass(frozen=True)
class WrongSiluFusion:
    """Bug: fuses silu(g) * u but passes the operands the wrong way round."""

    name: ClassVar[str] = "fuse-silu-mul"

    def run(self, module: Any, ctx: PassContext) -> bool:
        for op in module.main.ops:
            if op.name == "llm.silu_mul":
                op.operands = op.operands[::-1]
                return True
        return False


SILU = """module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {
  func.func @main(%g: tensor<2x8xf32>, %u: tensor<2x8xf32>) -> tensor<2x8xf32> {
    %y = llm.silu_mul %g, %u : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32> loc("hf:model.mlp")
    return %y : tensor<2x8xf32>
  }
}
"""

PASS_BUGS = {
    "dce-drops-cache-write": (CACHE, DceDropsCacheWrite()),
    "cse-ignores-attrs": (GELU, CseIgnoresAttrs()),
    "fold-add-as-sub": (FOLD, FoldsAddAsSub()),
    "attention-loses-causal-mask": (ATTN, DropsCausal()),
    "silu-mul-operands-swapped": (SILU, WrongSiluFusion()),
}


@pytest.mark.parametrize("key", sorted(PASS_BUGS))
def test_pass_bug_is_caught_by_translation_validation(key: str) -> None:
    text, bug = PASS_BUGS[key]
    res = run_pipeline(parse_module(text), [bug], validator=validate_pass)
    failed = res.failed_validation
    assert failed is not None, key
    assert failed["pass"] == bug.name
    assert failed["verdict"] == "not-equivalent" and failed["method"] == "differential"
    assert "input_desc" in failed and failed["details"]


def test_pass_bug_reports_first_differing_op_with_location() -> None:
    res = run_pipeline(
        parse_module(GELU, "gelu.llmir"), [CseIgnoresAttrs()], validator=validate_pass
    )
    details = "\n".join(res.failed_validation["details"])  # type: ignore[index]
    assert "first differing value: %y" in details
    assert "gelu.llmir:5:" in details and 'loc("hf:model.mlp.act")' in details


def test_correct_passes_validate() -> None:
    for text, p in (
        (GELU, PASSES["cse"]()),
        (FOLD, PASSES["constant-fold"]()),
        (CACHE, PASSES["dce"]()),
    ):
        res = run_pipeline(parse_module(text), [p], validator=validate_pass)
        assert res.failed_validation is None
        assert all(r.validation["verdict"] == "equivalent" for r in res.runs)  # type: ignore[index]


def test_suite_size() -> None:
    assert len(RULE_MUTANTS) + len(PASS_BUGS) >= 15
