"""Every registered op's `example` is one op line that parses, verifies and round-trips.

The example's operands become the arguments of a function (llmir_core/ir/snippet.py), the same
wrapping the golden FileCheck files and docs/spec.md use.
"""

from __future__ import annotations

import pytest

from llmir_core.dialects.opdef import OpDef
from llmir_core.dialects.registry import all_ops
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.ir.snippet import op_example_module, split_op_line
from llmir_core.verifier import verify

OPS = sorted(all_ops().items())


@pytest.mark.parametrize("name,opdef", OPS, ids=[n for n, _ in OPS])
def test_example_parses_verifies_and_round_trips(name: str, opdef: OpDef) -> None:
    example = opdef.example
    assert example and "\n" not in example, f"{name} needs a one-line `example`"
    _, opname, _, _, _ = split_op_line(example)
    assert opname == name, f"{name}'s example shows {opname}"
    module = parse_module(op_example_module(example, opdef.dialect, name))
    diags = verify(module, check_files=False)
    assert not diags, "\n".join(d.render() for d in diags)
    text = print_module(module)
    again = parse_module(text)
    assert again == module and print_module(again) == text


@pytest.mark.parametrize("name,opdef", OPS, ids=[n for n, _ in OPS])
def test_declaration_is_complete(name: str, opdef: OpDef) -> None:
    d = opdef
    assert d.summary.endswith(".") and d.verifies.endswith("."), name
    assert d.reference is not None or d.decompose is not None or name == "core.weight", (
        f"{name} has neither reference semantics nor a decomposition"
    )
    names = [o.name for o in d.operands] + [a.name for a in d.attrs]
    assert len(names) == len(set(names)), f"{name} repeats an operand or attribute name"


@pytest.mark.parametrize(
    "line,message",
    [
        (
            "%y = core.neg %x : (tensor<4xf32>) -> tensor<4xf32> extra",
            "expected the end of the op line",
        ),
        (
            "%y = core.add %x, %z : (tensor<4xf32>) -> tensor<4xf32>",
            "core.add has 2 operands but 1 operand types",
        ),
        ("core.neg", "expected ':' and the op's type signature"),
    ],
)
def test_malformed_examples_are_parse_errors(line: str, message: str) -> None:
    from llmir_core.errors import ParseError

    with pytest.raises(ParseError, match=message):
        split_op_line(line)
