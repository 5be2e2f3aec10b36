"""Malformed ONNX protobufs that protobuf accepts: attributes of the wrong type, initializers whose
data does not match their dims, negative or absurd dims, unknown element types. Each gets one line
naming the model and the node or tensor (exit 2), and no output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.inputs.helpers import invoke, listing, rejected

onnx = pytest.importorskip("onnx", reason="the onnx package is needed to write test models")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes: list[Any], inits: list[Any]) -> Any:
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])


def _matmul(edit: Callable[[Any], None]) -> Any:
    w = numpy_helper.from_array(np.ones((3, 3), np.float32), "w")
    edit(w)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [w])


def _dims(*d: int) -> Callable[[Any], None]:
    def edit(w: Any) -> None:
        del w.dims[:]
        w.dims.extend(d)

    return edit


def _short(w: Any) -> None:
    w.raw_data = w.raw_data[:20]


def _typed_short(w: Any) -> None:
    w.ClearField("raw_data")
    w.float_data.extend([1.0] * 4)


def _short_tensor() -> Any:
    t = numpy_helper.from_array(np.ones((3, 3), np.float32), "v")
    t.raw_data = b"\0" * 8
    return t


def _empty_raw(w: Any) -> None:
    w.raw_data = b""  # present (proto2) though empty
    w.float_data.extend([1.0] * 9)


def _dtype(w: Any) -> None:
    w.data_type = 999


CASES: dict[str, tuple[Any, str]] = {
    "perm given as an INT": (
        _model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=1)], []),
        "node 't' (Transpose): attribute 'perm' must be INTS, got INT",
    ),
    "perm given as FLOATS": (
        _model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[1.0, 0.0])], []),
        "node 't' (Transpose): attribute 'perm' must be INTS, got FLOATS",
    ),
    "raw_data shorter than its dims": (
        _matmul(_short),
        "initializer 'w' (FLOAT[3, 3]) has 20 bytes of raw_data, its dims need 36",
    ),
    "float_data shorter than its dims": (
        _matmul(_typed_short),
        "initializer 'w' (FLOAT[3, 3]) has 4 value(s) in float_data, its dims need 9",
    ),
    "dims [-2, 3]": (
        _matmul(_dims(-2, 3)),
        "initializer 'w' has dims [-2, 3]: a dim cannot be negative",
    ),
    "dims past any file": (
        _matmul(_dims(2**40, 2**40)),
        "initializer 'w' has dims [1099511627776, 1099511627776]",
    ),
    "unknown element type": (_matmul(_dtype), "initializer 'w' has unknown element type 999"),
    "raw_data set but empty": (
        _matmul(_empty_raw),
        "initializer 'w' (FLOAT[3, 3]) has 0 bytes of raw_data, its dims need 36",
    ),
    "Constant value short": (
        _model(
            [
                helper.make_node("Constant", [], ["c"], name="k", value=_short_tensor()),
                helper.make_node("MatMul", ["x", "c"], ["y"]),
            ],
            [],
        ),
        "node 'k' (Constant) attribute 'value' (FLOAT[3, 3]) has 8 bytes of raw_data, its dims need 36",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_onnx_is_located(tmp_path: Path, case: str) -> None:
    model, message = CASES[case]
    f = tmp_path / "m.onnx"
    f.write_bytes(model.SerializeToString())
    code, out, err = invoke("import", str(f), "-o", str(tmp_path / "m.llmir"))
    line = rejected(code, err, expect=2, names=f"{f}: ")
    assert message in line
    assert listing(tmp_path) == {"m.onnx"}


def test_well_formed_typed_data_imports(tmp_path: Path) -> None:
    def typed(w: Any) -> None:
        w.ClearField("raw_data")
        w.float_data.extend([1.0] * 9)

    f = tmp_path / "m.onnx"
    f.write_bytes(_matmul(typed).SerializeToString())
    code, out, err = invoke("import", str(f), "-o", str(tmp_path / "m.llmir"))
    assert code == 0, err


def test_attribute_type_checked_at_an_opset_without_the_op(tmp_path: Path) -> None:
    """RMSNormalization is opset 23; declared at opset 17 its attributes still get the schema check."""
    node = helper.make_node(
        "RMSNormalization", ["x", "s"], ["y"], name="norm", epsilon=[1e-5, 1e-6]
    )
    s = numpy_helper.from_array(np.ones(3, np.float32), "s")
    model = _model([node], [s])
    model.opset_import[0].version = 17
    f = tmp_path / "m.onnx"
    f.write_bytes(model.SerializeToString())
    code, out, err = invoke("import", str(f), "-o", str(tmp_path / "m.llmir"))
    line = rejected(code, err, expect=2, names=f"{f}: ")
    assert "node 'norm' (RMSNormalization): attribute 'epsilon' must be FLOAT, got FLOATS" in line


def test_op_type_not_utf8(tmp_path: Path) -> None:
    model = _model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[1, 0])], [])
    f = tmp_path / "m.onnx"
    f.write_bytes(model.SerializeToString().replace(b"Transpose", b"Tr\xafnspose"))
    code, out, err = invoke("import", str(f), "-o", str(tmp_path / "m.llmir"))
    line = rejected(
        code, err, expect=2, names=f"{f}: node #0 of graph 'g' whose op_type is not UTF-8 text"
    )
    assert "Tr\\xafnspose" in line
