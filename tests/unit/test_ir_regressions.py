"""Regression tests for bugs found in the IR's parser and printer (one test per bug).

Parse errors that used to be crashes (bad string escapes, deep nesting, out-of-range dense
values, zero-sized quant blocks) are in test_parser_errors.py with their positions.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmir_core.ir import (
    DenseAttr,
    Function,
    Module,
    SymDim,
    TensorType,
    parse_module,
    print_module,
)
from llmir_core.ir.dims import dim_sub
from llmir_core.ir.parser import Parser
from llmir_core.ir.types import DType

HEAD = 'module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {\n'


def round_trip(m: Module) -> Module:
    text = print_module(m)
    again = parse_module(text)
    assert again == m, text
    assert print_module(again) == text
    return again


def constant_module(arr: np.ndarray, dtype: DType) -> Module:
    from llmir_core.ir.core import Op

    t = TensorType(tuple(arr.shape), dtype)
    op = Op("core.constant", [], [t], {"value": DenseAttr(arr.astype(dtype.to_numpy()), t)}, ["c"])
    return Module("m", [Function("f", [], [op], [op.results[0]])], {"llmir.dialects": ("core",)})


def test_int4_dense_prints_as_integers() -> None:
    # int4 arrays (ml_dtypes, numpy kind 'V') were printed as floats, which do not parse back
    m = round_trip(constant_module(np.array([[-8, 7], [0, 1]]), DType.i4))
    assert "dense<[[-8, 7], [0, 1]]> : tensor<2x2xi4>" in print_module(m)


@pytest.mark.parametrize("dtype", [DType.bf16, DType.f8e4m3, DType.u4, DType.f16])
def test_exotic_dtype_dense_round_trips(dtype: DType) -> None:
    round_trip(constant_module(np.array([1, 2, 3]), dtype))


def test_empty_dense_of_rank_two_round_trips() -> None:
    # `dense<[]>` was refused for tensor<0x4xf32> (the printer's own output)
    m = round_trip(constant_module(np.zeros((0, 4)), DType.f32))
    assert "dense<[]> : tensor<0x4xf32>" in print_module(m)


def test_negative_zero_is_not_a_splat_of_zero() -> None:
    # [0.0, -0.0] compared equal elementwise and printed as the splat `0.0`, losing the sign
    m = round_trip(constant_module(np.array([0.0, -0.0]), DType.f32))
    assert "dense<[0.0, -0.0]>" in print_module(m)


def test_negative_symbolic_dim_attribute_round_trips() -> None:
    # `-?a+4` printed in an attribute did not parse back (a leading '-' before a '?name')
    d = dim_sub(4, SymDim.name("a"))
    m = round_trip(Module("m", [Function("f", [], attrs={"shape": (d, 2, SymDim.name("b"))})]))
    assert "shape = [-?a+4, 2, ?b]" in print_module(m)


def test_control_characters_in_strings_round_trip() -> None:
    # a raw tab inside a string made json.loads (strict) raise JSONDecodeError, not ParseError
    m = parse_module(HEAD + '  func.func @f() attributes {s = "a\tb"} {\n    return\n  }\n}\n')
    assert m.functions[0].attrs["s"] == "a\tb"
    round_trip(m)


@pytest.mark.parametrize("name", ["SmolLM2-135M", "my model", "", "é"])
def test_symbol_names_that_need_quotes_round_trip(name: str) -> None:
    # module and function names with '-' or spaces printed bare and did not parse back
    m = round_trip(Module(name, [Function(name, [])]))
    assert m.name == name and m.functions[0].name == name


@pytest.mark.parametrize("key", ["inf", "nan", "é", "with space", "1st", "a.b$c"])
def test_attribute_keys_that_need_quotes_round_trip(key: str) -> None:
    # keys read as numbers (inf, nan) or starting with a non-ASCII letter printed bare
    round_trip(Module("m", [Function("f", [], attrs={key: 1})]))


def test_loc_on_the_next_line_belongs_to_the_op() -> None:
    # the one-line fast path took the op without its loc(...) written on the following line,
    # and then failed on `loc`; the token parser attaches it (found by the parser fuzzer)
    t = "tensor<4xf32>"
    text = (
        HEAD + f"  func.func @f(%x: {t}) -> {t} {{\n    %y = core.neg %x : ({t}) -> {t}\n"
        f'    loc("hf:model.norm")\n    return %y : {t}\n  }}\n}}\n'
    )
    fast = Parser(text).parse_module()
    assert fast.functions[0].ops[0].origin == "hf:model.norm"
    assert fast == Parser(text, fast=False).parse_module()


def test_cached_attribute_dicts_are_not_shared() -> None:
    # the fast path caches parsed attribute dictionaries by their text; each op gets its own
    t = "tensor<2x2xf32>"
    line = f"core.matmul %x, %x {{transpose_b = true}} : ({t}, {t}) -> {t}"
    m = parse_module(
        HEAD + f"  func.func @f(%x: {t}) -> {t} {{\n    %a = {line}\n    %b = {line}\n"
        f"    return %b : {t}\n  }}\n}}\n"
    )
    a, b = m.functions[0].ops
    a.attrs["transpose_a"] = True
    assert "transpose_a" not in b.attrs
    assert "transpose_a" not in parse_module(print_module(m)).functions[0].ops[1].attrs


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_fast_path_positions_match_the_token_parser(newline: str) -> None:
    t = "tensor<4xf32>"
    text = (
        HEAD
        + f"  // comment\n  func.func @f(%x: {t}) -> {t} {{\n\n    %y, %z = core.top_k %x {{k = 2}} : "
        f"({t}) -> (tensor<2xf32>, tensor<2xi64>)\n      %w = core.neg %x : ({t}) -> {t}\n"
        f"    return %w : {t}\n  }}\n}}\n"
    ).replace("\n", newline)
    fast, slow = Parser(text).parse_module(), Parser(text, fast=False).parse_module()
    for a, b in zip(fast.functions[0].ops, slow.functions[0].ops):
        assert a.pos == b.pos
        assert [r.pos for r in a.results] == [r.pos for r in b.results]
    assert [(r.pos.line, r.pos.col) for r in fast.functions[0].ops[0].results] == [(5, 5), (5, 9)]


def test_fast_path_group_numbers() -> None:
    # the fast path unpacks _OP_LINE's groups by position: adding a group must update it
    from llmir_core.ir.parser import _OP_LINE

    assert list(_OP_LINE.groupindex.items()) == [
        ("line", 1),
        ("res", 2),
        ("op", 3),
        ("args", 4),
        ("attrs", 5),
        ("ins", 6),
        ("outs", 7),
        ("loc", 8),
    ]
    assert _OP_LINE.groups == 8
