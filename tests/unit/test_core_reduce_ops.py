"""core_reduce ops (reduce_*, softmax, log_softmax): references against onnxruntime, shape rules, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmir_core.dialects.registry import all_ops
from llmir_core.interp import run
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.ir.typeparse import parse_type_text
from llmir_core.verifier import verify

from .test_core_shape_ops import build, check, example_module, i64, ort_run, run_ir

REDUCE = {
    "sum": "ReduceSum",
    "mean": "ReduceMean",
    "max": "ReduceMax",
    "min": "ReduceMin",
    "prod": "ReduceProd",
}
RNG = np.random.default_rng(1)


def onnx_reduce(
    kind: str, x: np.ndarray, axes: tuple[int, ...], keepdims: bool
) -> list[np.ndarray]:
    return ort_run(REDUCE[kind], [x, i64(*axes)] if axes else [x], keepdims=int(keepdims))


@pytest.mark.parametrize("name", [f"reduce_{k}" for k in REDUCE] + ["softmax", "log_softmax"])
def test_declared_with_example_that_verifies(name: str) -> None:
    d = all_ops()[f"core.{name}"]
    assert d.summary and d.verifies.endswith(".") and d.reference is not None
    m = example_module(d.example)
    assert [x.message for x in verify(m)] == []
    assert parse_module(print_module(m)) == m


@pytest.mark.parametrize("kind", list(REDUCE))
@pytest.mark.parametrize("axes", [(), (1,), (0, -1), (-2,)])
@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("dt", [np.float32, np.int32, np.float16])
def test_reduce(kind: str, axes: tuple[int, ...], keepdims: bool, dt: Any) -> None:
    x = (
        RNG.integers(-4, 5, size=(3, 4, 5)) if dt == np.int32 else RNG.uniform(0.5, 1.5, (3, 4, 5))
    ).astype(dt)
    tol = {np.float32: 1e-6, np.float16: 2e-3, np.int32: 0}[dt]
    check(
        run_ir(f"core.reduce_{kind}", [x], {"axes": axes, "keepdims": keepdims}),
        onnx_reduce(kind, x, axes, keepdims),
        rtol=tol,
    )


@pytest.mark.parametrize("kind", list(REDUCE))
@pytest.mark.parametrize("dt", [np.float32, np.int64])
def test_reduce_over_no_elements(kind: str, dt: Any) -> None:
    x = np.zeros((0, 3), dt)
    if kind == "mean":
        pytest.skip(
            "ONNX leaves the mean of nothing undefined: llmir gives NaN (float; like numpy, torch and "
            "ONNX's reference) or raises (int), onnxruntime gives 0; see the identities test"
        )
    check(run_ir(f"core.reduce_{kind}", [x], {"axes": (0,)}), onnx_reduce(kind, x, (0,), True))


def test_reduce_empty_identities_follow_onnx() -> None:
    x = np.zeros((0, 2), np.float32)
    got = {
        k: run_ir(f"core.reduce_{k}", [x], {"axes": (0,), "keepdims": False})[0].tolist()
        for k in REDUCE
    }
    assert got["sum"] == [0, 0] and got["prod"] == [1, 1]
    assert (
        got["max"] == [-np.inf] * 2 and got["min"] == [np.inf] * 2 and np.isnan(got["mean"]).all()
    )
    b = np.zeros((0,), np.bool_)
    assert run_ir("core.reduce_max", [b])[0].tolist() == [False]
    assert run_ir("core.reduce_min", [b])[0].tolist() == [True]


@pytest.mark.parametrize("kind", ["max", "min"])
def test_reduce_bool(kind: str) -> None:
    x = RNG.integers(0, 2, size=(3, 4)).astype(np.bool_)
    check(run_ir(f"core.reduce_{kind}", [x], {"axes": (1,)}), onnx_reduce(kind, x, (1,), True))


def test_reduce_scalar_and_negative_int_mean() -> None:
    x = np.array(2.5, np.float32)
    check(run_ir("core.reduce_sum", [x]), onnx_reduce("sum", x, (), True))
    x = np.array([[-7, 2], [5, 0]], np.int64)  # -5 / 2 truncates toward zero, like onnxruntime
    check(run_ir("core.reduce_mean", [x], {"axes": (1,)}), onnx_reduce("mean", x, (1,), True))


def test_float_sum_is_rounded_once() -> None:
    x = np.array([1.0] + [2.0**-11] * 4, np.float16)  # each 2^-11 alone vanishes against 1.0 in f16
    assert run_ir("core.reduce_sum", [x])[0].tolist() == [1.001953125]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize(
    "dt,scale", [(np.float32, 1.0), (np.float32, 1000.0), (np.float16, 10.0), (np.float64, 1.0)]
)
def test_softmax(op: str, axis: int, dt: Any, scale: float) -> None:
    x = (RNG.standard_normal((2, 3, 5)) * scale).astype(
        dt
    )  # scale 1000: exp overflows unless stable
    tol = {np.float32: 1e-5, np.float16: 2e-3, np.float64: 1e-12}[dt]
    ours = run_ir(f"core.{op}", [x], {"axis": axis})
    assert np.isfinite(ours[0]).all()
    check(
        ours,
        ort_run("Softmax" if op == "softmax" else "LogSoftmax", [x], axis=axis),
        rtol=tol,
        atol=tol,
    )


def test_softmax_empty_axis_and_masked_rows() -> None:
    check(run_ir("core.softmax", [np.zeros((2, 0), np.float32)]), [np.zeros((2, 0), np.float32)])
    x = np.array([[0.0, -np.inf, 1.0]], np.float32)
    check(run_ir("core.softmax", [x]), ort_run("Softmax", [x], axis=-1), rtol=1e-6)


SYMBOLIC = [
    (
        "reduce_sum",
        "tensor<?b x ?s x 8 x f32>",
        {"axes": (-1,)},
        "tensor<?b x ?s x 1 x f32>",
        (2, 3, 8),
    ),
    (
        "reduce_mean",
        "tensor<?b x ?s x 8 x f32>",
        {"axes": (1,), "keepdims": False},
        "tensor<?b x 8 x f32>",
        (2, 3, 8),
    ),
    ("reduce_max", "tensor<?b x ?s x 8 x f32>", {}, "tensor<1x1x1xf32>", (2, 0, 8)),
    ("reduce_min", "tensor<?b x ?s x 8 x f32>", {"keepdims": False}, "tensor<f32>", (2, 3, 8)),
    (
        "reduce_prod",
        "tensor<?b x ?s x 8 x i64>",
        {"axes": (0, 2)},
        "tensor<1 x ?s x 1 x i64>",
        (2, 3, 8),
    ),
    (
        "softmax",
        "tensor<?b x 9 x ?q x ?k x f32>",
        {},
        "tensor<?b x 9 x ?q x ?k x f32>",
        (1, 9, 2, 3),
    ),
    ("log_softmax", "tensor<?b x ?v x bf16>", {"axis": 0}, "tensor<?b x ?v x bf16>", (2, 5)),
]


@pytest.mark.parametrize("op,type_,attrs,expected,shape", SYMBOLIC, ids=[c[0] for c in SYMBOLIC])
def test_symbolic_shape_rule(
    op: str, type_: str, attrs: dict[str, Any], expected: str, shape: tuple[int, ...]
) -> None:
    t = parse_type_text(type_)
    m, o = build(f"core.{op}", [t], attrs)
    assert o.results[0].type == parse_type_text(expected)
    assert [d.message for d in verify(m)] == []
    x = RNG.standard_normal(shape).astype(t.dtype.to_numpy())
    # the interpreter checks the result against the inferred type, binding ?b, ?s, ... from x
    assert run(m, [x])[0].ndim == o.results[0].type.rank


ERRORS = [
    ("reduce_sum", "tensor<3x4xbool>", {}, "x must be numeric, got bool"),
    ("reduce_mean", "tensor<3x4xf32>", {"axes": (2,)}, "axis 2 is out of range for rank 2"),
    ("reduce_max", "tensor<3x4xf32>", {"axes": (1, -1)}, "repeat an axis"),
    ("reduce_min", "tensor<3x4x!quant.q4_0>", {}, "x is quantized"),
    ("reduce_prod", "tensor<3x4xf32>", {"axes": (-3,)}, "axis -3 is out of range for rank 2"),
    ("softmax", "tensor<3x4xi32>", {}, "must have a float dtype, got i32"),
    ("log_softmax", "tensor<f32>", {}, "x must have rank >= 1"),
]


@pytest.mark.parametrize("op,type_,attrs,message", ERRORS, ids=[e[0] for e in ERRORS])
def test_verifier_error(op: str, type_: str, attrs: dict[str, Any], message: str) -> None:
    from llmir_core.builder import Builder
    from llmir_core.ir.core import Function, Module

    fn = Function("main", [])
    b = Builder(fn)
    x = b.arg("x", parse_type_text(type_))
    b.ret(
        *b.create(f"core.{op}", [x], attrs, result_types=[parse_type_text("tensor<f32>")]).results
    )
    msgs = [d.message for d in verify(Module("t", [fn], {"llmir.dialects": ("core",)}))]
    assert any(m.startswith(f"core.{op}: ") and message in m for m in msgs), msgs
