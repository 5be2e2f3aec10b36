"""Turn a single op line (an OpDef's `example`) into a function or a whole module.

An example's operands are implicitly function arguments: `%c = core.add %a, %b : (T, U) -> V`
becomes `func.func @name(%a: T, %b: U) -> V { <the line>  return %c : V }`. Tests parse and verify
every example this way, the FileCheck goldens are generated from it, and `docs/spec.md` shows it.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmir_core import SPEC_VERSION

from .parser import Parser
from .printer import format_symbol
from .types import Type


def split_op_line(line: str) -> tuple[list[str], str, list[str], list[Type], list[Type]]:
    """(result names, op name, operand names, operand types, result types) of one op line.

    Raises ParseError when the line is not one op (positions are within the line).
    """
    p = Parser(line, "<example>")
    results: list[str] = []
    if p.kind() == "val":
        while True:
            results.append(p.expect_kind("val", "a result name")[1:])
            if not p.accept(","):
                break
        p.expect("=", "after the result names")
    opname = p.expect_kind("id", "an op name")
    operands: list[str] = []
    if p.kind() == "val":
        while True:
            operands.append(p.take()[1:])
            if not p.accept(","):
                break
    if p.peek() == "{" and p.kind() == "p":
        p.parse_attr_dict()
    p.expect(":", "and the op's type signature")
    in_types = p.parse_type_list()
    p.expect("->", "between operand and result types")
    out_types = p.parse_type_list()
    if p.peek() == "loc" and p.kind() == "id":
        p.take()
        p.expect("(")
        p.expect_kind("str", "a location string")
        p.expect(")")
    if p.kind() != "eof":
        raise p.error(f"expected the end of the op line, found '{p.peek()}'")
    if len(in_types) != len(operands):
        raise p.error(f"{opname} has {len(operands)} operands but {len(in_types)} operand types", 0)
    return results, opname, operands, in_types, out_types


def op_function(line: str, name: str) -> str:
    """The text of a function named `name` whose arguments are the line's operands."""
    results, _, operands, in_types, out_types = split_op_line(line)
    args: dict[str, Type] = {}
    for n, t in zip(operands, in_types):
        args.setdefault(n, t)
    sig = ", ".join(f"%{n}: {t}" for n, t in args.items())
    head = f"func.func {format_symbol(name)}({sig})"
    if len(out_types) == 1:
        head += f" -> {out_types[0]}"
    elif out_types:
        head += " -> (" + ", ".join(map(str, out_types)) + ")"
    ret = "return"
    if results:
        ret += " " + ", ".join("%" + r for r in results) + " : " + ", ".join(map(str, out_types))
    return f"{head} {{\n  {line.strip()}\n  {ret}\n}}"


def module_text(
    functions: Iterable[str], name: str = "m", dialects: Iterable[str] = ("core",)
) -> str:
    """A module around function texts (indented two spaces), with the standard header."""
    ds = ", ".join(f'"{d}"' for d in sorted(set(dialects)))
    body = "\n\n".join("  " + f.replace("\n", "\n  ") for f in functions)
    return (
        f"module {format_symbol(name)} attributes {{llmir.dialects = [{ds}], "
        f'llmir.version = "{SPEC_VERSION}"}} {{\n{body}\n}}\n'
    )


def op_example_module(line: str, dialect: str, name: str = "example") -> str:
    """A module holding one function (`@name`) around an op line."""
    return module_text([op_function(line, name)], dialects={"core", dialect})


__all__ = ["split_op_line", "op_function", "module_text", "op_example_module"]
