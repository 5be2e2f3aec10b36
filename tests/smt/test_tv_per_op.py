"""Translation validation says, per op of the checked module, which way it was validated: by SMT
(equal terms; target ops expanded through their decompositions) or differentially (with the
op's declared reason when it has no encoding)."""

from __future__ import annotations

from llmir_core.dialects.registry import all_ops
from llmir_core.ir.parser import parse_module
from llmir_core.smt.tv import validate

HEAD = 'module @m attributes {llmir.dialects = ["core", "llm", "ort"], llmir.version = "0.1"} {\n'
T = "tensor<2x8xf32>"


def _module(body: str, args: str = f"%x: {T}, %w: tensor<8xf32>") -> str:
    return f"{HEAD}  func.func @main({args}) -> {T} {{\n{body}    return %y : {T}\n  }}\n}}\n"


def _rows(res: dict) -> dict[tuple[str, str], str]:  # type: ignore[type-arg]
    return {(r["op"], r["validated_by"]): r["how"] for r in res["ops"]}


def test_a_lowered_op_is_validated_through_its_decomposition() -> None:
    before = parse_module(
        _module(f"    %y = llm.rms_norm %x, %w {{eps = 1e-05}} : ({T}, tensor<8xf32>) -> {T}\n")
    )
    after = parse_module(
        _module(
            f"    %y = ort.simplified_layer_norm %x, %w {{epsilon = 1e-05}} : ({T}, tensor<8xf32>) -> {T}\n"
        )
    )
    res = validate(before, after, differential=False)
    assert res["verdict"] == "equivalent", res
    assert _rows(res) == {
        ("ort.simplified_layer_norm", "smt"): "expanded through its decomposition"
    }


def test_an_op_without_an_encoding_is_validated_differentially_with_its_reason() -> None:
    args = f"%x: {T}, %i: tensor<2x1xi64>, %u: tensor<2x1xf32>"
    line = (
        "    %s = core.scatter_elements %x, %i, %u {{axis = {}}} : "
        f"({T}, tensor<2x1xi64>, tensor<2x1xf32>) -> {T}\n"
        f"    %y = core.add %s, %x : ({T}, {T}) -> {T}\n"
    )
    before = parse_module(_module(line.format(1), args))
    after = parse_module(_module(line.format(0), args))  # the same operands, another axis
    res = validate(before, after, seeds=1)
    assert res["verdict"] == "not-equivalent", res
    assert _rows(res) == {
        ("core.scatter_elements", "differential"): all_ops()["core.scatter_elements"].no_smt,
        ("core.add", "differential"): "an operand already differs from the original's",
    }
