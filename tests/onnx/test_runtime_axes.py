"""Reduce* with `axes` given as a graph input: imported as core.reduce_*_dyn (run-time axes) where
the result's rank is known, and run through the reference interpreter, an onnxruntime build and
the CLI with the same outputs as onnxruntime on the original model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.frontends.onnx import import_onnx
from llmir_core.ir.parser import parse_module
from llmir_core.runtime.tensors import load_tensor, run_module
from llmir_core.targets.onnxruntime.graph import session_for_module
from llmir_core.verifier import verify

OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


def _model(op: str, keepdims: int, naxes: int = 1) -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
        "r",
        [
            h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4]),
            h.make_tensor_value_info("axes", T.INT64, [naxes]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


def _ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    return np.asarray(
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )[0]
    )


X = np.random.default_rng(0).uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("keepdims", [1, 0])
def test_runtime_axes_match_onnxruntime(op: str, keepdims: int) -> None:
    m = _model(op, keepdims, naxes=2)
    module, _ = import_onnx(m)
    assert any(o.name.endswith("_dyn") for f in module.functions for o in f.ops)
    sess, names, _ = session_for_module(module)
    for axes in ([0, 2], [-1, 1], [2, 0]):  # one import, several axes values at run time
        feeds = {"x": X, "axes": np.array(axes, np.int64)}
        want = _ort(m, feeds)
        np.testing.assert_allclose(run_module(module, feeds)["y"], want, rtol=1e-5)
        np.testing.assert_allclose(sess.run({n: feeds[n] for n in names})["y"], want, rtol=1e-5)


def test_empty_axes_input_reduces_everything() -> None:
    m = _model("ReduceSum", 1, naxes=0)
    module, _ = import_onnx(m)
    feeds = {"x": X, "axes": np.zeros(0, np.int64)}
    np.testing.assert_allclose(run_module(module, feeds)["y"], _ort(m, feeds), rtol=1e-5)


def test_unknown_number_of_axes_without_keepdims_is_refused() -> None:
    g = h.make_graph(
        [h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        "r",
        [
            h.make_tensor_value_info("x", T.FLOAT, [2, 3]),
            h.make_tensor_value_info("axes", T.INT64, ["n"]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    with pytest.raises(InputError, match=r"input 'axes' \(axes\) must be a constant"):
        import_onnx(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]))


def test_bad_runtime_axes_are_a_clear_error() -> None:
    module, _ = import_onnx(_model("ReduceSum", 1, naxes=2))
    with pytest.raises(Exception, match="repeat an axis"):
        run_module(module, {"x": X, "axes": np.array([1, -2], np.int64)})
    with pytest.raises(Exception, match="out of range"):
        run_module(module, {"x": X, "axes": np.array([0, 3], np.int64)})


def test_dyn_op_verifies_the_axes_length() -> None:
    text = """module @m {
  func.func @main(%x: tensor<2x3xf32>, %a: tensor<AxI64>) -> tensor<?x?xf32> {
    %y = core.reduce_sum_dyn %x, %a : (tensor<2x3xf32>, tensor<AxI64>) -> tensor<?x?xf32>
    return %y : tensor<?x?xf32>
  }
}
"""
    assert [e.message for e in verify(parse_module(text.replace("AxI64", "2xi64")))] == []
    msgs = [e.message for e in verify(parse_module(text.replace("AxI64", "3xi64")))]
    assert any("axes has 3 entries but x has rank 2" in m for m in msgs), msgs
    msgs = [e.message for e in verify(parse_module(text.replace("AxI64", "?xi64")))]
    assert any("axes must have a static length" in m for m in msgs), msgs


def test_import_build_run_cli(tmp_path: Path) -> None:
    m = _model("ReduceMean", 1)
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "a.npy", np.array([1], np.int64))
    cli = CliRunner()
    r = cli.invoke(app, ["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.llmir")])
    assert r.exit_code == 0, r.stderr
    want = _ort(m, {"x": X, "axes": np.array([1], np.int64)})
    for extra in ([], ["--backend", "onnxruntime"]):
        out = tmp_path / ("o" + str(len(extra)))
        r = cli.invoke(
            app,
            [
                "run",
                str(tmp_path / "m.llmir"),
                "--input",
                f"x={tmp_path / 'x.npy'}",
                "--input",
                f"axes={tmp_path / 'a.npy'}",
                "-o",
                str(out),
                *extra,
            ],
        )
        assert r.exit_code == 0, r.stderr
        np.testing.assert_allclose(load_tensor(str(out / "y.npy")), want, rtol=1e-6)
