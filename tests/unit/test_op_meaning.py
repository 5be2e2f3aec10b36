"""An op's whole meaning lives on its declaration: every op has reference semantics, a shape rule,
an SMT encoding or a declared reason why not, an interval rule or the fallback, and a cost or the
generic one; declarations are checked when registered."""

from __future__ import annotations

import pytest

from llmir_core.dialects.opdef import Attr, Lazy, OpDef, Operand
from llmir_core.dialects.registry import all_ops, get_op, register
from llmir_core.ir.parser import parse_module
from llmir_core.passes.metrics import measure, op_cost

z3 = pytest.importorskip("z3", reason="the SMT encoder needs z3-solver")

from llmir_core.smt.intervals import analyze  # noqa: E402
from llmir_core.smt.meaning import meaning_of  # noqa: E402

SOURCES = {
    "smt": {"explicit", "none"},
    "interval": {"explicit", "fallback"},
    "cost": {"explicit", "generic"},
}
# ops without a reference: their values come from outside the module
NO_REFERENCE = {"core.weight"}


@pytest.mark.parametrize("name", sorted(all_ops()))
def test_every_op_has_each_part_of_its_meaning(name: str) -> None:
    od = all_ops()[name]
    got = meaning_of(od)
    for part, allowed in SOURCES.items():
        assert got[part] in allowed, (name, part, got[part])
    assert od.declaration_errors() == []
    assert callable(od.infer)
    assert (od.reference is not None) != (name in NO_REFERENCE), name
    if od.smt is None:  # the reason is a clause a report can print after the op's name
        assert len(od.no_smt) > 20 and not od.no_smt.endswith("."), od.no_smt
    else:
        assert not od.no_smt
        fn = od.smt.resolve() if isinstance(od.smt, Lazy) else od.smt
        assert callable(fn), (name, od.smt)


def test_the_ops_without_an_encoding_are_few_and_known() -> None:
    """Rules over these cannot be proved and their rewrites are tested differentially."""
    none = sorted(n for n, od in all_ops().items() if od.smt is None)
    assert "llm.to_device" not in none and "core.add" not in none
    assert len(none) <= len(all_ops()) // 4, none  # 24 of 119 today


def test_declared_parts_are_the_ones_used() -> None:
    assert meaning_of(get_op("llm.to_device"))["smt"] == "explicit"  # type: ignore[arg-type]
    assert meaning_of(get_op("llm.linear"))["interval"] == "explicit"  # type: ignore[arg-type]
    assert meaning_of(get_op("core.add"))["interval"] == "explicit"  # type: ignore[arg-type]
    assert meaning_of(get_op("core.scatter_nd"))["smt"] == "none"  # type: ignore[arg-type]
    text = """module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {
  func.func @main(%x: tensor<2x8xf32>, %w: tensor<4x8xf32>, %b: tensor<4xf32>) -> tensor<2x4xf32> {
    %y = llm.linear %x, %w, %b {activation = "relu"} : (tensor<2x8xf32>, tensor<4x8xf32>, tensor<4xf32>) -> tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}
"""
    m = parse_module(text, "m.llmir")
    rep = analyze(m, input_range=(-1.0, 1.0))
    assert rep.ranges["y"] == (
        0.0,
        8 * 1.0 * 1.0 + 1.0,
    )  # relu(K |x| |w| + |b|), from the declaration
    flops, read = op_cost(m.main.ops[0], {})
    assert flops == 2 * 8 * 8 + 2 * 8 and read == 4 * (16 + 32 + 4)
    assert measure(m).flops_per_token == flops


@pytest.mark.parametrize(
    "attrs, message",
    [
        ((Attr("k", "integer", 0),), "unknown kind 'integer'"),
        ((Attr("k", "int", 1.5),), "default 1.5 is not a int"),
        ((Attr("k", "str", "c", choices=("a", "b")),), "default 'c' is not one of its choices"),
        ((Attr("k", "int", 0), Attr("k", "int", 0)), "declared twice"),
    ],
)
def test_bad_declarations_are_refused_at_registration(
    attrs: tuple[Attr, ...], message: str
) -> None:
    od = OpDef(
        name="test.bad_decl",
        summary="",
        operands=(Operand("x"),),
        attrs=attrs,
        infer=lambda ctx: [],
        reference=None,
        verifies="",
    )
    with pytest.raises(ValueError, match=message):
        register(od)
    assert get_op("test.bad_decl") is None


_ARN = """module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {
  func.func @main(%x: tensor<2x8xX>, %r: tensor<2x8xR>, %w: tensor<W>) -> tensor<2x8xX> {
    %y, %s = llm.add_rms_norm %x, %r, %w : (tensor<2x8xX>, tensor<2x8xR>, tensor<W>) -> (tensor<2x8xX>, tensor<2x8xX>)
    return %y : tensor<2x8xX>
  }
}
"""


@pytest.mark.parametrize(
    "x, r, w, message",
    [
        ("i32", "i32", "8xi32", "operand #0 (x) must have a float dtype, got i32"),
        ("f32", "f16", "8xf32", "residual has dtype f16, expected f32 (insert core.cast)"),
        ("f32", "f32", "1x8xf32", "weight must have rank 1, got tensor<1x8xf32>"),
    ],
)
def test_declared_operand_constraints_are_checked(x: str, r: str, w: str, message: str) -> None:
    from llmir_core.verifier import verify

    text = _ARN.replace("xX>", f"x{x}>").replace("xR>", f"x{r}>").replace("<W>", f"<{w}>")
    diags = verify(parse_module(text, "arn.llmir"))
    assert [d.message for d in diags] == [f"llm.add_rms_norm: {message}"]
    assert str(diags[0].pos) == "arn.llmir:3:14"


def test_operand_constraint_declarations_are_checked() -> None:
    od = OpDef(
        name="test.bad_operand",
        summary="",
        operands=(Operand("x", dtype_of="y"), Operand("y", kind="floaty")),
        attrs=(),
        infer=lambda ctx: [],
        reference=None,
        verifies="",
    )
    errs = od.declaration_errors()
    assert "operand 'x': dtype_of names no earlier operand ('y')" in errs
    assert "operand 'y' has unknown kind 'floaty' (kinds: tensor, float)" in errs
