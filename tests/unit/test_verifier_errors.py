"""Every verifier diagnostic: its message, its file:line:col, the source line and caret, notes.

Text cases are `.llmir` files with a `¦` before the op the diagnostic must point at (an op's
position is its name); they are written to a temp folder and read with parse_file, as
`llmir verify` does. Rules the parser already enforces on text (SSA order, single definition)
are checked on modules built in code, where nothing else catches them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmir_core.dialects.opdef import Attr, OpDef, Operand, OpVerifyError
from llmir_core.dialects.registry import OPS
from llmir_core.errors import Diagnostic
from llmir_core.ir import DType, Function, Module, Op, Value, parse_file, tensor
from llmir_core.verifier import verify

MARK = "¦"
T = "tensor<4xf32>"


def module(
    *ops: str,
    out: str = T,
    ret: str | None = None,
    args: str = f"%x: {T}",
    sig: str | None = None,
    dialects: str = '["core"]',
) -> str:
    """A module with one function @f(args) -> out whose body is `ops` and returns %y."""
    ret = f"%y : {out}" if ret is None else ret
    sig = f" -> {out}" if sig is None else sig
    body = "".join(f"    {o}\n" for o in ops)
    return (
        f'module @m attributes {{llmir.dialects = {dialects}, llmir.version = "0.1"}} {{\n'
        f"  func.func @f({args}){sig} {{\n{body}    return {ret}\n  }}\n}}\n"
    )


def weight(attrs: str, t: str = "tensor<2x2xf32>") -> str:
    return module(f"%y = {MARK}core.weight {{{attrs}}} : () -> {t}", out=t, args="")


CASES: list[tuple[str, str, str, list[str]]] = [
    (
        "unknown_op",
        module(f"%y = {MARK}core.ngg %x : ({T}) -> {T}"),
        "unknown op 'core.ngg'",
        ["did you mean core.neg"],
    ),
    (
        "unknown_dialect",
        module(f"%y = {MARK}vendor.fast_gelu %x : ({T}) -> {T}"),
        "unknown op 'vendor.fast_gelu'",
        [
            "dialect 'vendor' is not known to this llmir; an extension op must be registered with a "
            "decomposition into core ops"
        ],
    ),
    (
        "undeclared_dialect",
        module(f'%y = {MARK}onnx.opaque %x {{op_type = "Elu", opset = 21}} : ({T}) -> {T}'),
        "op 'onnx.opaque' is from dialect 'onnx', which the module header does not list in llmir.dialects",
        [],
    ),
    (
        "operand_count",
        module(f"%y = {MARK}core.neg %x, %x : ({T}, {T}) -> {T}"),
        "core.neg takes 1 operands (x), got 2",
        [],
    ),
    (
        "operand_count_optional",
        module(f"%y = {MARK}core.where %x : ({T}) -> {T}"),
        "core.where takes 3 operands (cond, a, b), got 1",
        [],
    ),
    (
        "unknown_attribute",
        module(f"%y = {MARK}core.neg %x {{fast = true}} : ({T}) -> {T}"),
        "core.neg has no attribute 'fast' (valid: none)",
        [],
    ),
    (
        "unknown_attribute_lists_valid",
        module(
            f"%y = {MARK}core.matmul %x, %x {{transpose = true}} : ({T}, {T}) -> tensor<f32>",
            out="tensor<f32>",
        ),
        "core.matmul has no attribute 'transpose' (valid: transpose_a, transpose_b)",
        [],
    ),
    (
        "attribute_kind",
        module(
            f"%y = {MARK}core.matmul %x, %x {{transpose_b = 1}} : ({T}, {T}) -> tensor<f32>",
            out="tensor<f32>",
        ),
        "core.matmul: attribute 'transpose_b' must be bool, got int 1",
        [],
    ),
    (
        "attribute_kind_dtype",
        module(
            f'%y = {MARK}core.cast %x {{to = "f16"}} : ({T}) -> tensor<4xf16>', out="tensor<4xf16>"
        ),
        "core.cast: attribute 'to' must be dtype, got str 'f16'",
        [],
    ),
    (
        "attribute_kind_dims",
        module(
            f"%y = {MARK}core.reshape %x {{shape = [2, true]}} : ({T}) -> tensor<2x2xf32>",
            out="tensor<2x2xf32>",
        ),
        "core.reshape: attribute 'shape' must be dims, got tuple (2, True)",
        [],
    ),
    (
        "attribute_choice",
        module(f'%y = {MARK}core.gelu %x {{approximate = "fast"}} : ({T}) -> {T}'),
        "core.gelu: attribute 'approximate' must be one of none, tanh, got 'fast'",
        [],
    ),
    (
        "attribute_required",
        module(f"%y = {MARK}core.cast %x : ({T}) -> tensor<4xf16>", out="tensor<4xf16>"),
        "core.cast requires attribute 'to' (dtype)",
        [],
    ),
    (
        "shape_rule",
        module(
            f"%y = {MARK}core.add %x, %z : ({T}, tensor<5xf32>) -> {T}",
            args=f"%x: {T}, %z: tensor<5xf32>",
        ),
        "core.add: shapes [4] and [5] do not broadcast",
        [],
    ),
    (
        "shape_rule_dtype",
        module(
            f"%y = {MARK}core.add %x, %z : ({T}, tensor<4xf16>) -> {T}",
            args=f"%x: {T}, %z: tensor<4xf16>",
        ),
        "core.add: operand dtypes differ: #0 is f32, #1 is f16 (insert core.cast)",
        [],
    ),
    (
        "result_count",
        module(f"%y, %z = {MARK}core.neg %x : ({T}) -> ({T}, {T})"),
        "core.neg produces 1 results, but 2 are declared",
        [],
    ),
    (
        "result_type",
        module(
            f"%y = {MARK}core.neg %x : ({T}) -> tensor<5xf32>",
            ret="%y : tensor<5xf32>",
            sig=" -> tensor<5xf32>",
        ),
        "core.neg: result #0 (%y) is declared tensor<5xf32> but the op produces tensor<4xf32>",
        [],
    ),
    (
        "result_dtype",
        module(
            f"%y = {MARK}core.neg %x : ({T}) -> tensor<4xf16>",
            ret="%y : tensor<4xf16>",
            sig=" -> tensor<4xf16>",
        ),
        "core.neg: result #0 (%y) is declared tensor<4xf16> but the op produces tensor<4xf32>",
        [],
    ),
    (
        "symbolic_dims_unify",
        module(
            f"%y = {MARK}core.neg %x : (tensor<?a x f32>) -> tensor<?b x f32>",
            args="%x: tensor<?a x f32>",
            ret="%y : tensor<?b x f32>",
            sig=" -> tensor<?b x f32>",
        ),
        "core.neg: result #0 (%y) is declared tensor<?b x f32> but the op produces tensor<?a x f32>",
        [],
    ),
    (
        "weight_missing_file",
        weight('file = "w.bin", nbytes = 16'),
        "core.weight: weight file w.bin not found",
        [],
    ),
    (
        "weight_nbytes",
        weight('file = "w.bin", nbytes = 15'),
        "core.weight: nbytes = 15, but tensor<2x2xf32> needs 16 bytes",
        [],
    ),
    (
        "weight_offset",
        weight('file = "w.bin", nbytes = 16, offset = -1'),
        "core.weight: offset -1 is negative",
        [],
    ),
    (
        "weight_sha256",
        weight('file = "w.bin", nbytes = 16, sha256 = "abc"'),
        "core.weight: sha256 must be 64 lowercase hex digits",
        [],
    ),
    (
        "weight_dynamic",
        weight('file = "w.bin", nbytes = 16', t="tensor<?x2xf32>"),
        "core.weight: a weight needs a static tensor type, got tensor<?x2xf32>",
        [],
    ),
    (
        "weight_quant_blocks",
        weight('file = "w.bin", nbytes = 18', t="tensor<16x!quant.q4_0>"),
        "core.weight: tensor<16x!quant.q4_0> does not split into whole quantization blocks",
        [],
    ),
]


@pytest.fixture
def weights_dir(tmp_path: Path) -> Path:
    (tmp_path / "w.bin").write_bytes(bytes(64))
    return tmp_path


def _write(folder: Path, marked: str) -> tuple[Path, int, int]:
    offset = marked.index(MARK)
    text = marked.replace(MARK, "")
    before = text[:offset]
    f = folder / "m.llmir"
    f.write_text(text, encoding="utf-8")
    return f, before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _only_error(diags: list[Diagnostic]) -> Diagnostic:
    assert len(diags) == 1, [d.header() for d in diags]
    return diags[0]


@pytest.mark.parametrize("name,marked,message,notes", CASES, ids=[c[0] for c in CASES])
def test_verifier_error(
    tmp_path: Path, name: str, marked: str, message: str, notes: list[str]
) -> None:
    if name != "weight_missing_file":
        (tmp_path / "w.bin").write_bytes(bytes(64))
    f, line, col = _write(tmp_path, marked)
    d = _only_error(verify(parse_file(str(f))))
    assert d.severity == "error"
    assert d.message.startswith(message), d.message
    assert (d.pos.file, d.pos.line, d.pos.col) == (str(f), line, col)
    for note in notes:
        assert any(note in n for n in d.notes), d.notes
    text = f.read_text().split("\n")
    rendered = d.render().splitlines()
    assert rendered[0].startswith(f"{f}:{line}:{col}: error: {message}")
    assert rendered[1] == "  " + text[line - 1]
    assert rendered[2] == "  " + " " * (col - 1) + "^"
    assert d.to_json()["line"] == line and d.to_json()["col"] == col


def test_case_names_are_unique() -> None:
    assert len({c[0] for c in CASES}) == len(CASES)


def test_undeclared_dialect_is_fine_once_declared(tmp_path: Path) -> None:
    text = module(
        f'%y = onnx.opaque %x {{op_type = "Elu", opset = 21}} : ({T}) -> {T}',
        dialects='["core", "onnx"]',
    )
    f, _, _ = _write(tmp_path, MARK + text)
    assert verify(parse_file(str(f))) == []


def test_dialects_header_must_be_strings(tmp_path: Path) -> None:
    text = module(f"%y = core.neg %x : ({T}) -> {T}", dialects='"core"')
    f, _, _ = _write(tmp_path, MARK + text)
    d = _only_error(verify(parse_file(str(f))))
    assert (
        d.message == "module attribute llmir.dialects must be an array of strings" and d.pos is None
    )


def test_weight_inside_file_verifies_and_files_can_be_skipped(weights_dir: Path) -> None:
    f, _, _ = _write(weights_dir, weight('file = "w.bin", nbytes = 16, offset = 48'))
    assert verify(parse_file(str(f))) == []
    f, line, _ = _write(weights_dir, weight('file = "w.bin", nbytes = 16, offset = 49'))
    d = _only_error(verify(parse_file(str(f))))
    assert d.message == "core.weight: tensor '?' needs bytes 49..65 but w.bin has only 64 bytes"
    assert verify(parse_file(str(f)), check_files=False) == []


def test_weight_sha256_accepted(weights_dir: Path) -> None:
    digest = hashlib.sha256(bytes(16)).hexdigest()
    f, _, _ = _write(weights_dir, weight(f'file = "w.bin", nbytes = 16, sha256 = "{digest}"'))
    assert verify(parse_file(str(f))) == []


def test_weight_referenced_inconsistently(weights_dir: Path) -> None:
    t = "tensor<2x2xf32>"
    w = f'core.weight {{file = "w.bin", name = "t", nbytes = 16, offset = OFF}} : () -> {t}'
    text = module(
        "%a = " + w.replace("OFF", "0"),
        f"%b = {MARK}" + w.replace("OFF", "16"),
        f"%y = core.add %a, %b : ({t}, {t}) -> {t}",
        args="",
        sig=f" -> {t}",
        ret=f"%y : {t}",
    )
    f, line, col = _write(weights_dir, text)
    d = _only_error(verify(parse_file(str(f))))
    assert d.message == (
        "core.weight: tensor 't' of w.bin is referenced at offset 16 (16 bytes) here "
        "but at offset 0 (16 bytes) before (at 3:10)"
    )
    assert (d.pos.line, d.pos.col) == (line, col)
    # the same reference twice (a tied embedding) is fine
    same = module(
        "%a = " + w.replace("OFF", "0"),
        "%b = " + w.replace("OFF", "0"),
        f"%y = core.add %a, %b : ({t}, {t}) -> {t}",
        args="",
        sig=f" -> {t}",
        ret=f"%y : {t}",
    )
    f, _, _ = _write(weights_dir, MARK + same)
    assert verify(parse_file(str(f))) == []


def test_symbolic_and_anonymous_dims_are_compatible(tmp_path: Path) -> None:
    text = module(
        "%y = core.neg %x : (tensor<?a x f32>) -> tensor<? x f32>",
        "%z = core.neg %y : (tensor<? x f32>) -> tensor<?a x f32>",
        args="%x: tensor<?a x f32>",
        ret="%z : tensor<?a x f32>",
        sig=" -> tensor<?a x f32>",
    )
    f, _, _ = _write(tmp_path, MARK + text)
    assert verify(parse_file(str(f))) == []


def test_repeated_errors_are_each_reported(tmp_path: Path) -> None:
    # the verifier skips re-checking op signatures it has seen verify; a failing one is
    # reported at every op that has it
    bad = f"core.neg %x : ({T}) -> tensor<5xf32>"
    text = module(
        f"%a = {bad}",
        f"%b = {bad}",
        f"%y = core.neg %x : ({T}) -> {T}",
        f"%z = core.neg %x : ({T}) -> {T}",
    )
    f, _, _ = _write(tmp_path, MARK + text)
    diags = verify(parse_file(str(f)))
    assert [d.pos.line for d in diags] == [3, 4]


def test_attribute_types_are_not_conflated_by_the_signature_cache(tmp_path: Path) -> None:
    # true == 1 in Python: a verified {transpose_b = true} must not excuse {transpose_b = 1}
    good = "core.matmul %x, %x {transpose_b = true} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>"
    text = module(
        f"%y = {good}",
        f"%z = {good.replace('true', '1')}",
        args="%x: tensor<2x2xf32>",
        ret="%y : tensor<2x2xf32>",
        sig=" -> tensor<2x2xf32>",
    )
    f, _, _ = _write(tmp_path, MARK + text)
    d = _only_error(verify(parse_file(str(f))))
    assert d.pos.line == 4 and "must be bool, got int 1" in d.message


# -- ops registered by the tests: declaration bugs become diagnostics, not crashes ----------


@pytest.fixture
def test_ops() -> Iterator[None]:
    def crash(ctx: object) -> list:
        raise ZeroDivisionError("division by zero")

    defs = [
        OpDef(
            "test.crash", "A shape rule that crashes.", (Operand("x"),), (), crash, None, "nothing."
        ),
        OpDef(
            "test.badkind",
            "An attribute of an unknown kind.",
            (Operand("x"),),
            (Attr("a", "matrix", 0),),
            lambda ctx: [ctx.types[0]],
            None,
            "nothing.",
        ),
        OpDef(
            "test.refuse",
            "A shape rule that refuses.",
            (Operand("x"), Operand("rest", variadic=True)),
            (),
            lambda ctx: (_ for _ in ()).throw(OpVerifyError("x must be blue")),
            None,
            "nothing.",
        ),
    ]
    for d in defs:
        OPS[d.name] = d
    yield
    for d in defs:
        del OPS[d.name]


def test_shape_rule_crash_is_a_diagnostic(tmp_path: Path, test_ops: None) -> None:
    f, line, col = _write(
        tmp_path, module(f"%y = {MARK}test.crash %x : ({T}) -> {T}", dialects='["test"]')
    )
    d = _only_error(verify(parse_file(str(f))))
    assert (
        d.message
        == "test.crash: internal error in its shape rule: ZeroDivisionError: division by zero"
    )
    assert "bug in the op's declaration" in d.notes[0] and (d.pos.line, d.pos.col) == (line, col)


def test_unknown_attribute_kind_is_a_diagnostic(tmp_path: Path, test_ops: None) -> None:
    f, _, _ = _write(
        tmp_path,
        module(f"%y = {MARK}test.badkind %x {{a = 1}} : ({T}) -> {T}", dialects='["test"]'),
    )
    d = _only_error(verify(parse_file(str(f))))
    assert (
        d.message == "test.badkind: attribute 'a' has unknown kind 'matrix' in the op declaration"
    )


def test_variadic_operand_count(tmp_path: Path, test_ops: None) -> None:
    f, _, _ = _write(tmp_path, module(f"%y = {MARK}test.refuse : () -> {T}", dialects='["test"]'))
    d = _only_error(verify(parse_file(str(f))))
    assert d.message == "test.refuse takes at least 1 operands (x, rest...), got 0"
    f, _, _ = _write(
        tmp_path, module(f"%y = {MARK}test.refuse %x, %x : ({T}, {T}) -> {T}", dialects='["test"]')
    )
    assert _only_error(verify(parse_file(str(f)))).message == "test.refuse: x must be blue"


# -- modules built in code (the parser rejects these in text) -------------------------------


def _neg(x: Value, name: str) -> Op:
    return Op("core.neg", [x], [x.type], result_names=[name])


def test_function_defined_twice() -> None:
    m = Module("m", [Function("f", []), Function("f", [])], {"llmir.dialects": ("core",)})
    d = _only_error(verify(m))
    assert d.message == "function @f is defined twice"


def test_argument_defined_twice() -> None:
    t = tensor((4,), DType.f32)
    m = Module("m", [Function("f", [Value("x", t), Value("x", t)])])
    assert _only_error(verify(m)).message == "argument %x is defined twice"


def test_operand_from_another_function() -> None:
    t = tensor((4,), DType.f32)
    x, stranger = Value("x", t), Value("s", t)
    op = _neg(stranger, "y")
    m = Module("m", [Function("f", [x], [op], [op.results[0]])])
    assert _only_error(verify(m)).message == (
        "operand #0 of core.neg (%s) is used before it is defined or comes from another function"
    )


def test_operand_used_before_definition() -> None:
    t = tensor((4,), DType.f32)
    x = Value("x", t)
    first = _neg(x, "a")
    second = _neg(first.results[0], "b")
    m = Module("m", [Function("f", [x], [second, first], [second.results[0]])])
    assert (
        "operand #0 of core.neg (%a) is used before it is defined" in _only_error(verify(m)).message
    )


def test_value_defined_twice() -> None:
    t = tensor((4,), DType.f32)
    x = Value("x", t)
    a, b = _neg(x, "y"), _neg(x, "y")
    m = Module("m", [Function("f", [x], [a, b], [b.results[0]])])
    assert _only_error(verify(m)).message == "value %y is defined twice"


def test_return_of_undefined_value() -> None:
    t = tensor((4,), DType.f32)
    m = Module("m", [Function("f", [Value("x", t)], [], [Value("ghost", t)])])
    assert _only_error(verify(m)).message == "@f returns %ghost, which is not defined in it"


def test_verify_never_raises_on_odd_attribute_values() -> None:
    # attributes built in code can hold anything; the verifier reports instead of crashing
    t = tensor((4,), DType.f32)
    x = Value("x", t)
    odd = Op("core.reshape", [x], [t], {"shape": ({"a": 1},)}, ["y"])
    m = Module("m", [Function("f", [x], [odd], [odd.results[0]])])
    d = _only_error(verify(m))
    assert "attribute 'shape' must be dims" in d.message
