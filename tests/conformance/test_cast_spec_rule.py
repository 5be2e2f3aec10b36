"""The ONNX node tests' Cast/CastLike cases are compared by the spec's rule, not by what numpy's
undefined out-of-range cast produced on the machine that generated them (onnx_node_cases.py)."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

from tests.conformance.onnx_node_cases import compare, undefined_elements


def _cast_case(src: int, dst: int, op: str = "Cast") -> SimpleNamespace:
    inputs = [helper.make_tensor_value_info("input", src, [25])]
    if op == "CastLike":
        inputs.append(helper.make_tensor_value_info("like", dst, [1]))
        node = helper.make_node("CastLike", ["input", "like"], ["output"])
    else:
        node = helper.make_node("Cast", ["input"], ["output"], to=dst)
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("output", dst, [25])]
    )
    return SimpleNamespace(
        model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    )


X = np.arange(-9, 16).astype(np.float32)  # the node tests' int4 inputs


def _int4(values: list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(ml_dtypes.int4)


def test_float_to_int4_out_of_range_elements_are_undefined() -> None:
    case = _cast_case(TensorProto.FLOAT, TensorProto.INT4)
    in_range = np.clip(X, -8, 7)
    zeroed = _int4(np.where((X < -8) | (X > 7), 0, X).astype(np.int64))  # one CPU's numpy
    wrapped = _int4(((X.astype(np.int64) + 8) % 16) - 8)  # onnxruntime's (and another CPU's)
    (undef,) = undefined_elements(case, [X], [zeroed])
    assert undef is not None and undef.tolist() == ((X < -8) | (X > 7)).tolist()
    assert compare(wrapped, zeroed, 0, 0, undef) is None
    assert compare(zeroed, wrapped, 0, 0, undef) is None
    assert compare(wrapped, zeroed, 0, 0) == "9 of 25 elements differ"  # without the rule
    wrong = np.asarray(in_range.astype(np.int64))
    wrong[12] += 1  # an in-range element (3.0) is still compared exactly
    assert compare(_int4(wrong), zeroed, 0, 0, undef) == "1 of 25 elements differ"


def test_float16_and_castlike_to_uint4_and_nan_inf() -> None:
    x = np.array([np.nan, np.inf, -np.inf, -0.5, 15.9, 16.0, 3.0], np.float16)
    for op in ("Cast", "CastLike"):
        case = _cast_case(TensorProto.FLOAT16, TensorProto.UINT4, op)
        want = np.zeros(7, ml_dtypes.uint4)
        (undef,) = undefined_elements(case, [x, np.zeros(1, ml_dtypes.uint4)], [want])
        assert undef is not None
        # -0.5 and 15.9 truncate into [0, 15]: defined
        assert undef.tolist() == [True, True, True, False, False, True, False]


def test_defined_casts_are_compared_as_recorded() -> None:
    ints = np.array([200, -56, 7], np.int16)
    assert undefined_elements(
        _cast_case(TensorProto.INT16, TensorProto.INT8), [ints], [ints.astype(np.int8)]
    ) == [None]  # fixed -> fixed wraps
    f8 = np.array([1e6, np.inf], np.float32)
    assert undefined_elements(
        _cast_case(TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN),
        [f8],
        [f8.astype(ml_dtypes.float8_e4m3fn)],
    ) == [None]  # saturate table
    add = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "g", [], [])
    assert undefined_elements(SimpleNamespace(model=helper.make_model(add)), [X, X], [X]) == [None]
