"""The reference interpreter's own contract: inputs, symbolic dims, checks, decompositions, errors.

(Each op's semantics is tested with the op; this file tests the machinery around them.)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import numpy as np
import pytest

from llmir_core.dialects.opdef import OpDef, Operand
from llmir_core.dialects.registry import OPS
from llmir_core.errors import InputError
from llmir_core.interp import InterpError, Interpreter, run
from llmir_core.ir import Module, parse_module

T = "tensor<?n x f32>"
CHAIN = f"""module @m attributes {{llmir.dialects = ["core", "test"], llmir.version = "0.1"}} {{
  func.func @main(%x: {T}, %y: {T}) -> {T} {{
    %a = core.add %x, %y : ({T}, {T}) -> {T}
    %b = core.neg %a : ({T}) -> {T}
    %c = core.exp %b : ({T}) -> {T}
    return %c : {T}
  }}

  func.func @other(%x: tensor<2xf32>) -> tensor<2xf32> {{
    %y = core.neg %x : (tensor<2xf32>) -> tensor<2xf32>
    return %y : tensor<2xf32>
  }}
}}
"""


def test_runs_main_and_named_functions() -> None:
    m = parse_module(CHAIN)
    x, y = np.array([0.0, 1.0], np.float32), np.array([1.0, -1.0], np.float32)
    (out,) = run(m, {"x": x, "y": y})
    np.testing.assert_allclose(out, np.exp(-(x + y)), rtol=1e-6)
    (neg,) = run(m, [x], fn="other")
    np.testing.assert_array_equal(neg, -x)


def test_unknown_function_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no function @nope in the module") as info:
        run(parse_module(CHAIN), [], fn="nope")
    assert info.value.hint == "its functions: @main, @other"


def test_module_without_functions() -> None:
    with pytest.raises(InputError, match="no function to run"):
        run(Module("m"), [])


@pytest.mark.parametrize(
    "inputs,message",
    [
        ({"x": np.zeros(2, np.float32)}, "missing input(s): y"),
        (
            {"x": np.zeros(2, np.float32), "y": np.zeros(2, np.float32), "z": 1},
            "unknown input(s): z",
        ),
        (
            {"x": np.zeros(2, np.float64), "y": np.zeros(2, np.float32)},
            "input x has dtype float64, expected f32",
        ),
        (
            {"x": np.zeros((2, 2), np.float32), "y": np.zeros(2, np.float32)},
            "input x has rank 2 [2, 2], expected rank 1",
        ),
        (
            {"x": np.zeros(2, np.float32), "y": np.zeros(3, np.float32)},
            "input y dim 0 is 3, but ?n is 2 elsewhere",
        ),
    ],
)
def test_input_errors(inputs: dict, message: str) -> None:
    with pytest.raises(InputError) as info:
        run(parse_module(CHAIN), inputs)
    assert message in info.value.message


def test_positional_input_count() -> None:
    with pytest.raises(InputError, match="@main takes 2 inputs, got 1"):
        run(parse_module(CHAIN), [np.zeros(2, np.float32)])


def test_intermediate_values_are_released_after_their_last_use() -> None:
    m = parse_module(CHAIN)
    refs: dict[str, weakref.ref] = {}
    interp = Interpreter(m)
    plain = interp.eval_op

    alive_at_c: list[bool] = []

    def eval_op(op, args, env=None):  # record a weak reference to every result
        if op.name == "core.exp":  # %a was last used by %b: it must be gone by now
            alive_at_c.append(refs["a"]() is not None)
        outs = plain(op, args, env)
        refs[op.results[0].name] = weakref.ref(outs[0])
        return outs

    interp.eval_op = eval_op  # type: ignore[method-assign]
    (out,) = interp.run({"x": np.ones(3, np.float32), "y": np.ones(3, np.float32)})
    assert alive_at_c == [False]
    assert refs["c"]() is out


def test_symbolic_dims_bind_across_inputs_and_results() -> None:
    text = """module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {
  func.func @main(%x: tensor<?b x ?s x f32>) -> tensor<?b*?s x f32> {
    %y = core.reshape %x {shape = [?b*?s]} : (tensor<?b x ?s x f32>) -> tensor<?b*?s x f32>
    return %y : tensor<?b*?s x f32>
  }
}
"""
    (y,) = run(parse_module(text), {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert y.shape == (6,)


# -- ops registered by the tests ---------------------------------------------------------


@pytest.fixture
def test_ops() -> Iterator[None]:
    def same(ctx: object) -> list:
        return [ctx.types[0]]  # type: ignore[attr-defined]

    defs = [
        OpDef(
            "test.overflow",
            "Raises OverflowError.",
            (Operand("x"),),
            (),
            same,
            lambda a, at: (_ for _ in ()).throw(OverflowError("too big")),
            "nothing.",
        ),
        OpDef(
            "test.wrong_dtype",
            "Returns float64.",
            (Operand("x"),),
            (),
            same,
            lambda a, at: a[0].astype(np.float64),
            "nothing.",
        ),
        OpDef(
            "test.twice",
            "2x, by decomposition only.",
            (Operand("x"),),
            (),
            same,
            None,
            "nothing.",
            decompose=lambda b, o, at: [b.op("core.add", o[0], o[0])],
        ),
    ]
    for d in defs:
        OPS[d.name] = d
    yield
    for d in defs:
        del OPS[d.name]


def _one_op(name: str) -> Module:
    return parse_module(CHAIN.replace("core.exp", name))


def test_reference_overflow_is_an_interp_error(test_ops: None) -> None:
    with pytest.raises(
        InterpError, match=r"<string>:5:10: test.overflow failed at run time: too big"
    ):
        run(_one_op("test.overflow"), {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})


def test_result_dtype_is_checked(test_ops: None) -> None:
    m = _one_op("test.wrong_dtype")
    with pytest.raises(
        InterpError, match="test.wrong_dtype produced dtype float64, declared tensor<"
    ):
        run(m, {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})
    (out,) = run(m, {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)}, check_types=False)
    assert out.dtype == np.float64


def test_op_without_reference_runs_its_decomposition(test_ops: None) -> None:
    x, y = np.array([1.0, 2.0], np.float32), np.array([0.5, 0.5], np.float32)
    (out,) = run(_one_op("test.twice"), {"x": x, "y": y})
    np.testing.assert_array_equal(out, -2 * (x + y))
