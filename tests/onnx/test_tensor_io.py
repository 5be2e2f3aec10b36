"""`llmir run` reads and writes every tensor type llmir has: .npy where numpy can carry the
type, ONNX TensorProto .pb where it cannot (bfloat16, float8, int4/uint4)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.frontends.onnx import ONNX_TO_DTYPE
from llmir_core.ir.types import numpy_dtype
from llmir_core.runtime.tensors import load_tensor, needs_pb, write_outputs

ALL = sorted(ONNX_TO_DTYPE.items())


def _sample(code: int) -> np.ndarray:
    dt = numpy_dtype(ONNX_TO_DTYPE[code])
    if dt == np.bool_:
        return np.array([[True, False, True], [False, False, True]])
    vals = np.array([[0, 1, -2], [3, -4, 5]], dtype=np.float64)
    if dt.name.startswith("u"):
        vals = np.abs(vals)
    return vals.astype(dt)


@pytest.mark.parametrize(
    ("code", "dt"), ALL, ids=[onnx.TensorProto.DataType.Name(c) for c, _ in ALL]
)
def test_every_llmir_type_round_trips_through_the_written_file(
    tmp_path: Path, code: int, dt: object
) -> None:
    a = _sample(code)
    (p,) = write_outputs({"out/x": a}, str(tmp_path))
    assert p.endswith(".pb") == needs_pb(a)
    b = load_tensor(p)
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(b.astype(np.float64), a.astype(np.float64))
    if p.endswith(".pb"):  # an ONNX TensorProto of the right ONNX type
        t = onnx.TensorProto()
        t.ParseFromString(Path(p).read_bytes())
        assert t.data_type == code


@pytest.mark.parametrize(
    "dt", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.int4]
)
def test_npy_that_lost_its_type_is_one_clear_error(tmp_path: Path, dt: object) -> None:
    np.save(tmp_path / "a.npy", np.zeros(3, dt))
    with pytest.raises(InputError, match=r"a\.npy: a \.npy file .*numpy") as e:
        load_tensor(str(tmp_path / "a.npy"))
    assert ".pb" in (e.value.hint or "")


def _cast_model() -> onnx.ModelProto:
    """x: float8e4m3 in; y = Cast(x, float) * 2 -> bfloat16 / float8e5m2 / int4 outputs."""
    two = nh.from_array(np.array(2.0, np.float32), "two")
    g = h.make_graph(
        [
            h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
            h.make_node("Mul", ["xf", "two"], ["m"]),
            h.make_node("Cast", ["m"], ["b"], to=T.BFLOAT16),
            h.make_node("Cast", ["m"], ["e"], to=T.FLOAT8E5M2),
            h.make_node("Cast", ["m"], ["i"], to=T.INT4),
            h.make_node("Identity", ["xf"], ["f"]),
        ],
        "io",
        [h.make_tensor_value_info("x", T.FLOAT8E4M3FN, [2, 3])],
        [
            h.make_tensor_value_info("b", T.BFLOAT16, [2, 3]),
            h.make_tensor_value_info("e", T.FLOAT8E5M2, [2, 3]),
            h.make_tensor_value_info("i", T.INT4, [2, 3]),
            h.make_tensor_value_info("f", T.FLOAT, [2, 3]),
        ],
        [two],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 23)])


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_run_reads_and_writes_exotic_types_through_the_cli(tmp_path: Path, backend: str) -> None:
    onnx.save(_cast_model(), tmp_path / "m.onnx")
    r = CliRunner().invoke(
        app, ["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.llmir")]
    )
    assert r.exit_code == 0, r.stderr
    x = np.array([[0.5, 1, -1.5], [2, -3, 3.5]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    (tmp_path / "x.pb").write_bytes(nh.from_array(x, "x").SerializeToString())
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        [
            "run",
            str(tmp_path / "m.llmir"),
            "--input",
            f"x={tmp_path / 'x.pb'}",
            "-o",
            str(out),
            "--backend",
            backend,
        ],
    )
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["b.pb", "e.pb", "f.npy", "i.pb"]
    assert "b.pb is an ONNX TensorProto: .npy cannot carry its element type" in r.stderr
    assert "i: int4[2, 3]  min" in r.stdout
    want = x.astype(np.float32) * 2
    got = {p.stem: load_tensor(str(p)) for p in out.iterdir()}
    assert got["b"].dtype == ml_dtypes.bfloat16 and got["e"].dtype == ml_dtypes.float8_e5m2
    assert got["i"].dtype == ml_dtypes.int4
    np.testing.assert_array_equal(got["f"], x.astype(np.float32))
    np.testing.assert_array_equal(got["b"].astype(np.float32), want)
    np.testing.assert_array_equal(
        got["e"].astype(np.float32), want.astype(ml_dtypes.float8_e5m2).astype(np.float32)
    )
    np.testing.assert_array_equal(
        got["i"].astype(np.float32), want.astype(ml_dtypes.int4).astype(np.float32)
    )
