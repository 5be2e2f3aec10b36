"""The ONNX frontend: types and symbolic dims, locations, weights, folding, unknown ops."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from llmir_core.errors import InputError
from llmir_core.frontends import import_model
from llmir_core.frontends.onnx import NeedsConstantError, import_onnx
from llmir_core.ir.printer import print_module
from llmir_core.runtime.tensors import run_module
from llmir_core.verifier import verify
from tests.onnx.models import _model, mlp, save


def _text(model: onnx.ModelProto, **kw) -> str:
    module, _ = import_onnx(model, **kw)
    assert verify(module, check_files=False) == []
    return print_module(module)


def test_dim_params_become_named_symbolic_dims() -> None:
    nodes = [h.make_node("Concat", ["a", "b"], ["y"], axis=1, name="cat")]
    ins = [
        h.make_tensor_value_info("a", T.FLOAT, ["batch", "past_sequence_length", 4]),
        h.make_tensor_value_info("b", T.FLOAT, ["batch", "x_len", 4]),
    ]
    text = _text(_model(nodes, ins, [h.make_tensor_value_info("y", T.FLOAT, None)]))
    assert "%a: tensor<?batch x ?past_sequence_length x 4 x f32>" in text
    # names llmir reserves (a leading x) are prefixed; sizes add up symbolically
    assert "tensor<?batch x ?_x_len+?past_sequence_length x 4 x f32>" in text


def test_dim_param_expression_and_unnamed_dims() -> None:
    nodes = [h.make_node("Relu", ["a"], ["y"], name="r")]
    ins = [h.make_tensor_value_info("a", T.FLOAT, ["past + 1", None, 3])]
    assert "%a: tensor<?past+1 x ? x 3 x f32>" in _text(
        _model(nodes, ins, [h.make_tensor_value_info("y", T.FLOAT, None)])
    )


def test_node_names_become_locations() -> None:
    text = _text(mlp())
    for name in ("norm", "mlp/up", "mlp/silu", "residual"):
        assert f'loc("onnx:{name}")' in text
    assert "llm.rms_norm" in text


def test_runtime_shape_arithmetic_folds_to_a_symbolic_reshape() -> None:
    nodes = [
        h.make_node("Shape", ["x"], ["s"], name="shape"),
        h.make_node("Gather", ["s", "zero"], ["b"], axis=0, name="g"),
        h.make_node("Unsqueeze", ["b", "axes0"], ["bu"], name="u"),
        h.make_node("Concat", ["bu", "minus1", "eight"], ["shp"], axis=0, name="cat"),
        h.make_node("Reshape", ["x", "shp"], ["y"], name="rs"),
    ]
    inits = [
        nh.from_array(np.array(0, np.int64), "zero"),
        nh.from_array(np.array([0], np.int64), "axes0"),
        nh.from_array(np.array([-1], np.int64), "minus1"),
        nh.from_array(np.array([8], np.int64), "eight"),
    ]
    m = _model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 16])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        inits,
    )
    text = _text(m)
    assert "core.reshape %x {shape = [?batch, -1, 8]}" in text
    assert "-> tensor<?batch x 2*?seq x 8 x f32>" in text
    assert "core.shape" not in text and "core.concat" not in text  # dead shape math is dropped


def test_weights_reference_external_data_in_place(tmp_path: Path) -> None:
    src = save(mlp(), str(tmp_path / "m.onnx"), external=True)
    out = tmp_path / "sub" / "m.llmir"
    out.parent.mkdir()
    import_model(src, out_path=out)
    text = out.read_text()
    assert (
        'core.weight {file = "../m.onnx.data", name = "w_up", nbytes = 32768, offset = 0}' in text
    )
    assert not (tmp_path / "sub" / "m.weights.bin").exists()  # nothing copied
    module, _ = import_onnx(src)  # without an output path the reference is absolute
    weights = [op for op in module.main.ops if op.name == "core.weight"]
    assert weights and all(os.path.isabs(op.attrs["file"]) for op in weights)


def test_embedded_weights_go_to_one_weights_file(tmp_path: Path) -> None:
    src = save(mlp(), str(tmp_path / "m.onnx"))
    module = import_model(src, out_path=tmp_path / "m.llmir")
    side = tmp_path / "m.weights.bin"
    text = (tmp_path / "m.llmir").read_text()
    assert side.is_file() and 'file = "m.weights.bin"' in text
    # the 256-byte norm weight stays inline; the two 32 KiB matrices go to the weights file
    assert "%norm.weight = core.constant" in text and text.count("core.weight") == 2
    x = np.random.default_rng(0).standard_normal((1, 3, 64)).astype(np.float32)
    want = run_module(import_onnx(src)[0], {"x": x})["y"]
    np.testing.assert_array_equal(run_module(module, {"x": x})["y"], want)


def test_model_over_2gb_imports_without_reading_weights(tmp_path: Path) -> None:
    n = 600_000_000  # 2.4 GB of f32 in a sparse file: never read by the import
    data = tmp_path / "big.onnx.data"
    with open(data, "wb") as fh:
        fh.truncate(4 * n)
    w = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[n])
    w.data_location = T.EXTERNAL
    for k, v in (("location", "big.onnx.data"), ("offset", "0"), ("length", str(4 * n))):
        e = w.external_data.add()
        e.key, e.value = k, v
    m = _model(
        [h.make_node("Add", ["x", "w"], ["y"], name="add")],
        [h.make_tensor_value_info("x", T.FLOAT, [n])],
        [h.make_tensor_value_info("y", T.FLOAT, [n])],
        [w],
    )
    onnx.save(m, str(tmp_path / "big.onnx"))
    module = import_model(tmp_path / "big.onnx", out_path=tmp_path / "big.llmir")
    assert "nbytes = 2400000000" in (tmp_path / "big.llmir").read_text()
    from llmir_core.targets.onnxruntime.graph import to_onnx

    proto, plan, _, _ = to_onnx(module)
    assert proto.ByteSize() < 10_000 and plan.size == 4 * n  # weights stay external data


def test_unknown_op_error_names_op_domain_opset_and_node() -> None:
    m = _model(
        [h.make_node("Hardmax", ["x"], ["y"], name="my_hardmax")],
        [h.make_tensor_value_info("x", T.FLOAT, [3])],
        [h.make_tensor_value_info("y", T.FLOAT, [3])],
        opset=21,
    )
    with pytest.raises(InputError) as exc:
        import_onnx(m)
    msg = exc.value.message
    assert (
        "node 'my_hardmax'" in msg and "Hardmax" in msg and "opset 21" in msg and "not known" in msg
    )
    assert "--keep-unknown" in (exc.value.hint or "")
    m2 = _model(
        [h.make_node("Foo", ["x"], ["y"], domain="com.example", name="foo")],
        [h.make_tensor_value_info("x", T.FLOAT, [3])],
        [h.make_tensor_value_info("y", T.FLOAT, [3])],
    )
    m2.opset_import.append(h.make_opsetid("com.example", 2))
    with pytest.raises(InputError, match=r"node 'foo' \(com.example:Foo, opset 2\)"):
        import_onnx(m2)


def test_keep_unknown_keeps_an_opaque_op_with_onnx_types() -> None:
    m = _model(
        [
            h.make_node("Hardmax", ["x"], ["e"], axis=0, name="hmax"),
            h.make_node("Relu", ["e"], ["y"], name="relu"),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        opset=21,
    )
    text = _text(m, keep_unknown=True)
    assert (
        'onnx.opaque %x {attributes = {axis = 0}, domain = "", op_type = "Hardmax", opset = 21}'
        in text
    )
    assert "-> tensor<?n x 4 x f32>" in text and 'llmir.dialects = ["core", "llm", "onnx"]' in text


def test_attribute_inputs_must_be_constant() -> None:
    m = _model(
        [h.make_node("Unsqueeze", ["x", "axes"], ["y"], name="unsq")],
        [
            h.make_tensor_value_info("x", T.FLOAT, [3]),
            h.make_tensor_value_info("axes", T.INT64, [1]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    with pytest.raises(NeedsConstantError, match="input 'axes'") as exc:
        import_onnx(m)
    assert exc.value.input_name == "axes"


def test_odd_value_names_are_kept_as_io_names() -> None:
    m = _model(
        [h.make_node("Relu", ["input:0"], ["out/0"], name="r")],
        [h.make_tensor_value_info("input:0", T.FLOAT, [2])],
        [h.make_tensor_value_info("out/0", T.FLOAT, [2])],
    )
    module, _ = import_onnx(m)
    assert module.main.attrs["input_names"] == ("input:0",)
    assert module.main.attrs["output_names"] == ("out/0",)
    out = run_module(module, {"input:0": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["out/0"], [0.0, 2.0])


def test_import_is_deterministic(tmp_path: Path) -> None:
    src = save(mlp(), str(tmp_path / "m.onnx"), external=True)
    a = print_module(import_model(src, out_path=tmp_path / "a.llmir"))
    b = print_module(import_model(src, out_path=tmp_path / "a.llmir"))
    assert a == b


def test_unsupported_model_kinds() -> None:
    with pytest.raises(InputError, match="unknown model format"):
        import_model(__file__)
    with pytest.raises(InputError, match="no such file"):
        import_model("/nonexistent/model.onnx")
