"""Models older than the importer's minimum opset are converted with onnx.version_converter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.frontends.onnx import MIN_OPSET, import_onnx
from llmir_core.runtime.tensors import run_module


def _opset7() -> onnx.ModelProto:
    """Opset 7: Softmax over axis 1 (2-D coercion semantics), Unsqueeze/ReduceSum with axes
    attributes, Add with broadcasting; all change form by opset 13."""
    w = nh.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "w")
    g = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w"], ["m"]),
            h.make_node("Softmax", ["m"], ["s"], axis=1),
            h.make_node("ReduceSum", ["s"], ["r"], axes=[1], keepdims=1),
            h.make_node("Unsqueeze", ["r"], ["y"], axes=[0]),
        ],
        "old",
        [
            h.make_tensor_value_info("x", T.FLOAT, [2, 3]),
            h.make_tensor_value_info("w", T.FLOAT, [3, 4]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 1])],
        [w],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 7)], ir_version=3)
    onnx.checker.check_model(m)
    return m


def _ort(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0])


def test_opset7_is_converted_and_matches_onnxruntime() -> None:
    m = _opset7()
    module, _ = import_onnx(m)
    assert module.attrs["onnx.converted_from_opset"] == 7
    assert module.attrs["onnx.opset"] == MIN_OPSET
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    got = run_module(module, {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(m, x), rtol=1e-5, atol=1e-6)


def test_import_cli_says_it_converted(tmp_path: Path) -> None:
    onnx.save(_opset7(), tmp_path / "old.onnx")
    r = CliRunner().invoke(
        app, ["import", str(tmp_path / "old.onnx"), "-o", str(tmp_path / "m.llmir")]
    )
    assert r.exit_code == 0, r.stderr
    assert "opset 7 converted to opset 13 with onnx.version_converter" in r.stderr
    r = CliRunner().invoke(
        app,
        ["import", str(tmp_path / "old.onnx"), "-o", str(tmp_path / "n.llmir"), "--format", "json"],
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["converted_from_opset"] == 7


def test_a_model_the_converter_cannot_convert_is_one_clear_error() -> None:
    # Upsample at opset 7 needs a 'scales' attribute; without it the converter fails
    g = h.make_graph(
        [h.make_node("Upsample", ["x"], ["y"], mode="nearest")],
        "bad",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 1, 2, 2])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 7)], ir_version=3)
    with pytest.raises(
        InputError, match=r"opset 7 is older than 13.*onnx.version_converter cannot convert it"
    ):
        import_onnx(m)
