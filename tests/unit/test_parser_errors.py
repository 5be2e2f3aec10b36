"""Every parser and type-syntax error: its message and its file:line:col.

Each case is `.llmir` text with a `¦` where the error must point; the test removes the marker,
parses, and checks the ParseError's message, position and source line. The cases follow the
error sites of llmir_core/ir/parser.py and typeparse.py in order.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmir_core.errors import InputError, ParseError
from llmir_core.ir.parser import MAX_NESTING, parse_file, parse_module

MARK = "¦"
HEAD = 'module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {\n'
T = "tensor<4xf32>"


def fn(*ops: str, args: str = f"%x: {T}", ret: str = f"%x : {T}", sig: str = f" -> {T}") -> str:
    """A module with one function @f; `ops` are its body lines."""
    body = "".join(f"    {o}\n" for o in ops)
    return f"{HEAD}  func.func @f({args}){sig} {{\n{body}    return {ret}\n  }}\n}}\n"


def op(line: str) -> str:
    """A function computing %y from %x with one op line."""
    return fn(line, ret=f"%y : {T}")


CASES: list[tuple[str, str, str]] = [
    # -- lexical --------------------------------------------------------------------------
    (
        "bad_escape_in_loc",
        op(f'%y = core.neg %x : ({T}) -> {T} loc("a{MARK}\\q")'),
        "bad escape in string: Invalid \\escape",
    ),
    (
        "bad_escape_in_attr",
        fn(f'%y = core.neg %x {{s = "{MARK}\\u12"}} : ({T}) -> {T}', ret=f"%y : {T}"),
        "bad escape in string",
    ),
    (
        "unexpected_character",
        fn(f"%y = core.neg %x {MARK}# : ({T}) -> {T}", ret=f"%y : {T}"),
        "expected ':' and the type signature of core.neg, found unexpected character '#'",
    ),
    (
        "unterminated_string",
        op(f'%y = core.neg %x : ({T}) -> {T} loc({MARK}"abc)'),
        "expected a location string, found an unterminated string",
    ),
    # -- module ---------------------------------------------------------------------------
    ("empty_input", f"{MARK}", "empty input: expected 'module'"),
    ("comments_only", f"// nothing here\n{MARK}", "empty input: expected 'module'"),
    (
        "not_a_module",
        f"{MARK}func.func @f() {{\n  return\n}}\n",
        "expected 'module' at the start of the file, found 'func.func'",
    ),
    (
        "bad_version",
        f'module @m attributes {MARK}{{llmir.version = "9.9"}} {{\n}}\n',
        "unsupported llmir spec version '9.9'; this llmir reads '0.1'",
    ),
    (
        "attributes_without_dict",
        f"module @m attributes {MARK}[1] {{\n}}\n",
        "expected '{', found '['",
    ),
    ("module_without_body", f"module @m {MARK}func.func", "expected '{' to open the module body"),
    (
        "module_not_closed",
        f"{HEAD}  func.func @f() {{\n    return\n  }}\n{MARK}",
        "unexpected end of file: the module body is not closed with '}'",
    ),
    (
        "function_redefined",
        f"{HEAD}  func.func @f() {{\n    return\n  }}\n  {MARK}func.func @f() {{\n"
        "    return\n  }\n}\n",
        "redefinition of function @f (first defined at 2:3)",
    ),
    (
        "text_after_module",
        f"{HEAD}}}\n{MARK}module",
        "expected end of file after the module, found 'module'",
    ),
    # -- functions ------------------------------------------------------------------------
    (
        "not_a_function",
        f"{HEAD}  {MARK}%x = core.neg\n}}\n",
        "expected 'func.func' (a function), found '%x'",
    ),
    (
        "function_without_name",
        f"{HEAD}  func.func {MARK}main() {{\n    return\n  }}\n}}\n",
        "expected a function name like @main, found 'main'",
    ),
    (
        "function_without_parens",
        f"{HEAD}  func.func @f {MARK}{{\n    return\n  }}\n}}\n",
        "expected '(', found '{'",
    ),
    (
        "argument_without_percent",
        f"{HEAD}  func.func @f({MARK}x: {T}) {{\n    return\n  }}\n}}\n",
        "expected an argument name like %x, found 'x'",
    ),
    (
        "argument_without_type",
        f"{HEAD}  func.func @f(%x{MARK}) {{\n    return\n  }}\n}}\n",
        "expected ':', found ')'",
    ),
    ("argument_redefined", fn(args=f"%x: {T}, {MARK}%x: {T}"), "redefinition of argument %x"),
    (
        "argument_list_separator",
        fn(args=f"%x: {T} {MARK}%z: {T}"),
        "expected ',' or ')' in the argument list, found '%z'",
    ),
    (
        "function_without_body",
        f"{HEAD}  func.func @f() {MARK}return\n}}\n",
        "expected '{' to open the function body, found 'return'",
    ),
    (
        "function_not_closed",
        f"{HEAD}  func.func @f() {{\n{MARK}",
        "unexpected end of file in function @f: missing 'return' and '}'",
    ),
    (
        "function_after_return",
        f"{HEAD}  func.func @f() {{\n    return\n    {MARK}core.neg\n  }}\n}}\n",
        "expected '}' after 'return' to close the function, found 'core.neg'",
    ),
    # -- return ---------------------------------------------------------------------------
    (
        "return_without_types",
        fn(ret=f"%x {MARK}}}"),
        "expected ':' and the returned types, found '}'",
    ),
    ("return_count_mismatch", fn(ret=f"%x : {MARK}{T}, {T}"), "return lists 1 values but 2 types"),
    (
        "return_type_mismatch",
        fn(ret=f"{MARK}%x : tensor<5xf32>"),
        "return type tensor<5xf32> does not match %x's type tensor<4xf32>",
    ),
    ("return_undefined", fn(ret=f"{MARK}%nope : {T}"), "use of undefined value %nope"),
    (
        "return_vs_signature",
        fn(ret=f"%x : {T}", sig="").replace("    return", f"    {MARK}return"),
        "function @f returns (tensor<4xf32>) but its signature says (nothing)",
    ),
    (
        "return_nothing_vs_signature",
        fn(ret="").replace("    return", f"    {MARK}return"),
        "function @f returns (nothing) but its signature says (tensor<4xf32>)",
    ),
    # -- ops ------------------------------------------------------------------------------
    (
        "result_without_equals",
        op(f"%y {MARK}core.neg %x : ({T}) -> {T}"),
        "expected '=' after the result names, found 'core.neg'",
    ),
    (
        "op_name_without_dialect",
        op(f"%y = {MARK}neg %x : ({T}) -> {T}"),
        "expected an op name like core.add, found 'neg'",
    ),
    (
        "op_name_missing",
        op(f"%y = {MARK}%x : ({T}) -> {T}"),
        "expected an op name like core.add, found '%x'",
    ),
    (
        "undefined_operand",
        op(f"%y = core.neg {MARK}%nope : ({T}) -> {T}"),
        "use of undefined value %nope",
    ),
    (
        "use_before_definition",
        fn(
            f"%y = core.neg {MARK}%z : ({T}) -> {T}",
            f"%z = core.neg %x : ({T}) -> {T}",
            ret=f"%y : {T}",
        ),
        "use of undefined value %z",
    ),
    (
        "op_without_signature",
        op(f"%y = core.neg %x {MARK}-> {T}"),
        "expected ':' and the type signature of core.neg, found '->'",
    ),
    (
        "op_types_without_parens",
        op(f"%y = core.neg %x : {MARK}{T} -> {T}"),
        "expected '(' to open the operand types, found 'tensor<4xf32>'",
    ),
    (
        "op_type_list_separator",
        fn(f"%y = core.add %x, %x : ({T} {MARK}{T}) -> {T}", ret=f"%y : {T}"),
        "expected ',' or ')' in the operand types, found 'tensor<4xf32>'",
    ),
    (
        "op_without_arrow",
        op(f"%y = core.neg %x : ({T}) {MARK}{T}"),
        "expected '->' between operand and result types, found 'tensor<4xf32>'",
    ),
    (
        "result_type_list_separator",
        fn(f"%a, %b = core.top_k %x {{k = 1}} : ({T}) -> ({T} {MARK}{T})", ret=f"%x : {T}"),
        "expected ',' or ')' in the type list, found 'tensor<4xf32>'",
    ),
    (
        "loc_without_parens",
        op(f'%y = core.neg %x : ({T}) -> {T} loc {MARK}"a"'),
        "expected '(', found '\"a\"'",
    ),
    (
        "loc_without_string",
        op(f"%y = core.neg %x : ({T}) -> {T} loc({MARK}a)"),
        "expected a location string, found 'a'",
    ),
    (
        "loc_not_closed",
        op(f'%y = core.neg %x : ({T}) -> {T} loc("a" {MARK}"b")'),
        "expected ')', found '\"b\"'",
    ),
    (
        "operand_count_vs_types",
        fn(f"%y = {MARK}core.add %x, %x : ({T}) -> {T}", ret=f"%y : {T}"),
        "core.add has 2 operands but its signature lists 1 types",
    ),
    (
        "operand_type_vs_definition",
        op(f"%y = core.neg %x : ({MARK}tensor<5xf32>) -> {T}"),
        "operand %x has type tensor<4xf32>, but the signature says tensor<5xf32>",
    ),
    (
        "result_count_vs_types",
        op(f"%y = core.neg %x : ({T}) -> {MARK}({T}, {T})"),
        "core.neg defines 1 results but its signature lists 2 result types",
    ),
    (
        "value_redefined",
        fn(
            f"%y = core.neg %x : ({T}) -> {T}",
            f"{MARK}%y = core.neg %x : ({T}) -> {T}",
            ret=f"%y : {T}",
        ),
        "redefinition of value %y (first defined at 3:5)",
    ),
    (
        "result_shadows_argument",
        op(f"{MARK}%x = core.neg %x : ({T}) -> {T}").replace("return %y", "return %x"),
        "redefinition of value %x (first defined at 2:16)",
    ),
    # -- types ----------------------------------------------------------------------------
    ("type_expected", fn(args=f"%x: {MARK}f32"), "expected a type, found 'f32'"),
    (
        "tensor_not_closed",
        fn(args=f"%x: {MARK}tensor<4xf32", sig=""),
        "malformed tensor type: expected tensor<DIMS x DTYPE> with a closing '>'",
    ),
    ("unknown_dtype", fn(args=f"%x: tensor<4x{MARK}f33>"), "unknown element type 'f33'"),
    ("compact_missing_x", fn(args=f"%x: tensor<4{MARK}?xf32>"), "expected 'x' after a dimension"),
    (
        "compact_named_dim",
        fn(args=f"%x: tensor<{MARK}?batchx4xf32>"),
        "named dims need the spaced form: tensor<?batch x 4 x f32>",
    ),
    (
        "spaced_bad_dim",
        fn(args=f"%x: tensor<?b x 4{MARK}.5 x f32>"),
        "unexpected '.5' in dimension",
    ),
    (
        "spaced_dim_starts_with_x",
        fn(args=f"%x: tensor<?b x {MARK}?xs x f32>"),
        "symbolic dim name 'xs' may not start with 'x'",
    ),
    (
        "anonymous_dim_in_expression",
        fn(args=f"%x: tensor<?b+{MARK}? x f32>"),
        "anonymous '?' cannot be part of an expression",
    ),
    (
        "dim_expression_ends_early",
        fn(args="%x: tensor<?b+ x f32>").replace("?b+ x", f"?b+{MARK} x"),
        "dimension expression ends early",
    ),
    (
        "dim_unbalanced_paren",
        fn(args="%x: tensor<(?b+1 x f32>").replace("(?b+1", f"(?b+1{MARK}"),
        "expected ')' in dimension",
    ),
    ("dim_operator_first", fn(args=f"%x: tensor<{MARK}*?b x f32>"), "unexpected '*' in dimension"),
    (
        "dim_trailing_token",
        fn(args=f"%x: tensor<?b {MARK}?c x f32>"),
        "unexpected '?c' in dimension",
    ),
    (
        "dim_negative",
        fn(args=f"%x: tensor<{MARK}2-3 x ?b x f32>"),
        "a dimension cannot be negative",
    ),
    (
        "dim_nested_too_deeply",
        fn(args=f"%x: tensor<{MARK}{'(' * 2000}?b{')' * 2000} x f32>"),
        "dimension expression nested too deeply",
    ),
    (
        "tensor_option_syntax",
        fn(args=f"%x: tensor<4xf32, {MARK}layout=NCHW>"),
        "expected key=\"value\" tensor option, got 'layout=NCHW'",
    ),
    (
        "tensor_option_unknown",
        fn(args=f'%x: tensor<4xf32, {MARK}color="red">'),
        "unknown tensor option 'color' (known: layout, device, sema)",
    ),
    (
        "tensor_option_twice",
        fn(args=f'%x: tensor<4xf32, layout="a", {MARK}layout="b">'),
        "tensor option 'layout' given twice",
    ),
    (
        "quant_preset_unknown",
        fn(args=f"%x: tensor<32x{MARK}!quant.q9_9>"),
        "unknown quantization preset '!quant.q9_9'",
    ),
    (
        "quant_without_scheme",
        fn(args=f"%x: tensor<32x{MARK}!quant<bits=4>>"),
        "!quant<...> must start with the scheme name",
    ),
    (
        "quant_param_syntax",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits>>"),
        "expected key=value in !quant<...>, got 'bits'",
    ),
    (
        "quant_missing_param",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits=4>>"),
        "bad !quant<...> parameters: 'block'",
    ),
    (
        "quant_bad_number",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits=four, block=32>>"),
        "bad !quant<...> parameters",
    ),
    (
        "quant_bad_scale",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits=4, block=32, scale=f99>>"),
        "unknown quant scale dtype 'f99'",
    ),
    (
        "quant_bad_zero",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits=4, block=32, zero=max>>"),
        "quant zero must be none, int or min, got 'max'",
    ),
    (
        "quant_bits_range",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits=0, block=32>>"),
        "quant bits must be 1 to 8, got 0",
    ),
    (
        "quant_block_zero",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits=4, block=0>>"),
        "quant block must be positive",
    ),
    (
        "quant_unknown_param",
        fn(args=f"%x: tensor<32x{MARK}!quant<nbits, bits=4, block=32, color=1>>"),
        "unknown !quant<...> parameter 'color'",
    ),
    (
        "kv_field_syntax",
        fn(args=f"%c: !llm.kv_cache<{MARK}layers>", ret="", sig=""),
        "expected key=value in kv_cache, got 'layers'",
    ),
    (
        "kv_field_twice",
        fn(args=f"%c: !llm.kv_cache<layers=1, {MARK}layers=2>", ret="", sig=""),
        "kv_cache field 'layers' given twice",
    ),
    (
        "kv_field_unknown",
        fn(args=f"%c: !llm.kv_cache<layers=1, {MARK}heads=2>", ret="", sig=""),
        "unknown kv_cache field 'heads' (known: layers, kv_heads, max_len, head_dim, dtype)",
    ),
    (
        "kv_field_missing",
        fn(args=f"%c: !llm.kv_cache<layers=1, kv_heads=2{MARK}>", ret="", sig=""),
        "kv_cache is missing max_len, head_dim, dtype",
    ),
    (
        "kv_dtype_unknown",
        fn(
            args=f"%c: !llm.kv_cache<layers=1, kv_heads=2, max_len=?, head_dim=64, "
            f"dtype={MARK}f99>",
            ret="",
            sig="",
        ),
        "unknown dtype 'f99' in kv_cache",
    ),
    (
        "kv_positive_int",
        fn(
            args=f"%c: !llm.kv_cache<layers={MARK}0, kv_heads=2, max_len=?, head_dim=64, "
            f"dtype=f16>",
            ret="",
            sig="",
        ),
        "kv_cache layers must be a positive integer, got '0'",
    ),
    (
        "kv_max_len_empty",
        fn(
            args=f"%c: !llm.kv_cache<layers=1, kv_heads=2, max_len={MARK}, head_dim=64, dtype=f16>",
            ret="",
            sig="",
        ),
        "expected a dimension",
    ),
    (
        "kv_max_len_bad",
        fn(
            args=f"%c: !llm.kv_cache<layers=1, kv_heads=2, max_len={MARK}?xx, head_dim=64, "
            f"dtype=f16>",
            ret="",
            sig="",
        ),
        "symbolic dim name 'xx' may not start with 'x'",
    ),
    # -- attributes -----------------------------------------------------------------------
    (
        "attr_nesting",
        fn(
            f"%y = core.neg %x {{a = {'[' * MAX_NESTING}{MARK}[]{']' * MAX_NESTING}}} : ({T}) -> {T}",
            ret=f"%y : {T}",
        ),
        f"attribute nesting deeper than {MAX_NESTING} levels",
    ),
    (
        "attr_name_expected",
        op(f"%y = core.neg %x {{{MARK}1 = 2}} : ({T}) -> {T}"),
        "expected an attribute name, found '1'",
    ),
    (
        "attr_twice",
        op(f"%y = core.neg %x {{a = 1, {MARK}a = 2}} : ({T}) -> {T}"),
        "attribute 'a' given twice",
    ),
    (
        "attr_without_equals",
        op(f"%y = core.neg %x {{a {MARK}1}} : ({T}) -> {T}"),
        "expected '=' after attribute name 'a', found '1'",
    ),
    (
        "attr_separator",
        op(f"%y = core.neg %x {{a = 1 {MARK}b = 2}} : ({T}) -> {T}"),
        "expected ',' or '}' between attributes, found 'b'",
    ),
    (
        "attr_bad_dim",
        op(f"%y = core.neg %x {{a = [{MARK}?b * * 2]}} : ({T}) -> {T}"),
        "unexpected '*' in dimension",
    ),
    (
        "attr_bad_quant",
        op(f"%y = core.neg %x {{a = {MARK}!quant.q9}} : ({T}) -> {T}"),
        "unknown quantization preset '!quant.q9'",
    ),
    (
        "attr_array_separator",
        op(f"%y = core.neg %x {{a = [1 {MARK}true]}} : ({T}) -> {T}"),
        "expected ',' or ']' in the array, found 'true'",
    ),
    (
        "attr_value_expected",
        op(f"%y = core.neg %x {{a = {MARK}bogus}} : ({T}) -> {T}"),
        "expected an attribute value, found 'bogus'",
    ),
    (
        "attr_value_missing",
        op(f"%y = core.neg %x {{a = {MARK}}} : ({T}) -> {T}"),
        "expected an attribute value, found '}'",
    ),
    # -- dense constants ------------------------------------------------------------------
    (
        "dense_without_angle",
        op(f"%y = core.neg %x {{a = dense {MARK}[1]}} : ({T}) -> {T}"),
        "expected '<' after 'dense', found '['",
    ),
    (
        "dense_not_closed",
        op(f"%y = core.neg %x {{a = dense<[1] {MARK}: tensor<1xi64>}} : ({T}) -> {T}"),
        "expected '>' to close dense<...>, found ':'",
    ),
    (
        "dense_without_type",
        op(f"%y = core.neg %x {{a = dense<[1]> {MARK}}} : ({T}) -> {T}"),
        "expected ':' and the type of the dense constant, found '}'",
    ),
    (
        "dense_dynamic_type",
        op(f"%y = core.neg %x {{a = dense<[1]> : {MARK}tensor<?xi64>}} : ({T}) -> {T}"),
        "a dense constant needs a static, non-quantized tensor type",
    ),
    (
        "dense_kv_type",
        op(
            f"%y = core.neg %x {{a = dense<[1]> : {MARK}!llm.kv_cache<layers=1, kv_heads=1, "
            f"max_len=4, head_dim=4, dtype=f16>}} : ({T}) -> {T}"
        ),
        "a dense constant needs a static, non-quantized tensor type",
    ),
    (
        "dense_out_of_range",
        op(f"%y = core.neg %x {{a = dense<{MARK}[1, 300]> : tensor<2xi8>}} : ({T}) -> {T}"),
        "bad dense constant: 300 is out of range for i8 (-128..127)",
    ),
    (
        "dense_i4_out_of_range",
        op(f"%y = core.neg %x {{a = dense<{MARK}[8]> : tensor<1xi4>}} : ({T}) -> {T}"),
        "bad dense constant: 8 is out of range for i4 (-8..7)",
    ),
    (
        "dense_float_in_int",
        op(f"%y = core.neg %x {{a = dense<{MARK}[1.5]> : tensor<1xi32>}} : ({T}) -> {T}"),
        "bad dense constant: i32 constants take integers",
    ),
    (
        "dense_int_in_bool",
        op(f"%y = core.neg %x {{a = dense<{MARK}[1]> : tensor<1xbool>}} : ({T}) -> {T}"),
        "bad dense constant: bool constants take true/false",
    ),
    (
        "dense_ragged",
        op(f"%y = core.neg %x {{a = dense<{MARK}[[1], [2, 3]]> : tensor<2x2xi64>}} : ({T}) -> {T}"),
        "bad dense constant: rows of different lengths",
    ),
    (
        "dense_ragged_float",
        op(f"%y = core.neg %x {{a = dense<{MARK}[[1.0], []]> : tensor<2x1xf32>}} : ({T}) -> {T}"),
        "bad dense constant",
    ),
    (
        "dense_shape_mismatch",
        op(f"%y = core.neg %x {{a = dense<{MARK}[1, 2, 3]> : tensor<2xi64>}} : ({T}) -> {T}"),
        "dense constant has shape [3] but its type says [2]",
    ),
    (
        "dense_separator",
        op(f"%y = core.neg %x {{a = dense<[1 {MARK}2]> : tensor<2xi64>}} : ({T}) -> {T}"),
        "expected ',' or ']' in the dense literal, found '2'",
    ),
    (
        "dense_not_a_number",
        op(f'%y = core.neg %x {{a = dense<[{MARK}"1"]> : tensor<1xi64>}} : ({T}) -> {T}'),
        "expected a number in the dense literal, found '\"1\"'",
    ),
]


def _locate(marked: str) -> tuple[str, int, int]:
    assert marked.count(MARK) == 1, "mark the error position with exactly one ¦"
    offset = marked.index(MARK)
    text = marked.replace(MARK, "")
    before = text[:offset]
    line = before.count("\n") + 1
    col = offset - (before.rfind("\n") + 1) + 1
    return text, line, col


@pytest.mark.parametrize("marked,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_error(marked: str, message: str) -> None:
    text, line, col = _locate(marked)
    with pytest.raises(ParseError) as info:
        parse_module(text, "t.llmir")
    err = info.value
    assert message in err.message, err.message
    assert (err.pos.file, err.pos.line, err.pos.col) == ("t.llmir", line, col), err.message
    assert err.message.startswith(f"t.llmir:{line}:{col}: error: ")
    assert err.exit_code == 2 and err.hint
    (diag,) = err.diagnostics
    assert diag.source_line == text.split("\n")[line - 1]
    assert diag.render().splitlines()[2] == "  " + " " * (col - 1) + "^"


def test_case_names_are_unique() -> None:
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names))


def test_fast_and_token_parsers_report_the_same_error() -> None:
    # the one-line fast path hands any op it does not accept to the token parser: an error in
    # a canonical-looking line is reported by the token parser, at the same place
    from llmir_core.ir.parser import Parser

    for name, marked, _ in CASES:
        text, _, _ = _locate(marked)
        errors = []
        for fast in (True, False):
            try:
                Parser(text, "t.llmir", fast=fast).parse_module()
                errors.append(None)
            except ParseError as exc:
                errors.append(exc.message)
        assert errors[0] == errors[1], name


# -- files ---------------------------------------------------------------------------------


def test_parse_file_missing(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file") as info:
        parse_file(str(tmp_path / "nope.llmir"))
    assert info.value.exit_code == 2 and info.value.hint


def test_parse_file_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder"):
        parse_file(str(tmp_path))


def test_parse_file_binary(tmp_path: Path) -> None:
    f = tmp_path / "model.onnx"
    f.write_bytes(b"\x08\x07\xff\xfe\x00binary")
    with pytest.raises(
        InputError, match=r"model.onnx:1:3: error: not UTF-8 text \(byte 0xff at offset 2\)"
    ) as info:
        parse_file(str(f))
    assert "llmir import" in (info.value.hint or "")


def test_parse_file_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    def deny(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(builtins, "open", deny)
    with pytest.raises(InputError, match="cannot read: Permission denied"):
        parse_file(str(tmp_path / "x.llmir"))


def test_parse_file_names_the_file_in_positions(tmp_path: Path) -> None:
    f = tmp_path / "bad.llmir"
    f.write_text(HEAD + "  func.func @f() {\n    return %x : tensor<f32>\n  }\n}\n")
    with pytest.raises(ParseError) as info:
        parse_file(str(f))
    assert str(info.value.pos) == f"{f}:3:12"


def test_line_numbers_ignore_other_line_breaks() -> None:
    # a form feed or U+2028 inside a string is not a line break for positions or source lines
    text = fn(
        f'%y = core.neg %x : ({T}) -> {T} loc("a\x0cb\u2028c")',
        f"%z = core.neg %nope : ({T}) -> {T}",
        ret=f"%y : {T}",
    )
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert (info.value.pos.line, info.value.pos.col) == (4, 19)
    assert info.value.diagnostics[0].source_line == f"    %z = core.neg %nope : ({T}) -> {T}"


def test_crlf_source_line_has_no_carriage_return() -> None:
    text = fn(f"%y = core.neg %nope : ({T}) -> {T}", ret=f"%y : {T}").replace("\n", "\r\n")
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert (info.value.pos.line, info.value.pos.col) == (3, 19)
    assert not info.value.diagnostics[0].source_line.endswith("\r")


def test_type_text_errors_the_tokenizer_never_produces() -> None:
    # parse_type_text is also an API (the fast path calls it on text the tokenizer matched)
    from llmir_core.ir.typeparse import TypeSyntaxError, parse_type_text

    for text, message in [
        ("vector<4xf32>", "unknown type 'vector<4xf32>'"),
        ("tensor<4xf32", "tensor type is missing its closing '>'"),
        ("!llm.kv_cache<layers=1", "kv_cache type is missing its closing '>'"),
    ]:
        with pytest.raises(TypeSyntaxError, match=re.escape(message)):
            parse_type_text(text)
