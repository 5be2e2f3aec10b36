"""The ONNX tensor types beyond the common ones (uint16..uint64, int2/uint2, float4e2m1, the FNUZ
float8s, float8e8m0): Cast semantics against onnx's reference implementation, the packing of
sub-byte tensors, and `llmir run` reading and writing them on both backends."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.frontends.onnx import import_onnx
from llmir_core.ir.types import DType, numpy_dtype, pack_sub_byte, unpack_sub_byte
from llmir_core.onnx_backend import LlmirRep

X = np.array(
    [0.0, 0.124, 0.25, 0.3, 0.75, 1.1, 1.5, 3.0, 1e-40, 1e30, 3e38, -1.0, np.nan, np.inf],
    np.float32,
)


def _cast(to: int, opset: int = 25, **attrs: object) -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Cast", ["x"], ["y"], to=to, **attrs)],
        "cast",
        [h.make_tensor_value_info("x", T.FLOAT, [len(X)])],
        [h.make_tensor_value_info("y", to, [len(X)])],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


CASTS = [
    (T.FLOAT8E8M0, {"round_mode": "up"}),
    (T.FLOAT8E8M0, {"round_mode": "down"}),
    (T.FLOAT8E8M0, {"round_mode": "nearest"}),
    (T.FLOAT8E8M0, {"round_mode": "up", "saturate": 0}),
    (T.FLOAT8E4M3FNUZ, {}),
    (T.FLOAT8E4M3FNUZ, {"saturate": 0}),
    (T.FLOAT8E5M2FNUZ, {}),
    (T.FLOAT8E4M3FN, {"saturate": 0}),
]


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize(("to", "attrs"), CASTS, ids=[f"{t}-{a}" for t, a in CASTS])
def test_cast_matches_onnx_reference(backend: str, to: int, attrs: dict[str, object]) -> None:
    model = _cast(to, **attrs)
    (want,) = ReferenceEvaluator(model).run(None, {"x": X})
    (got,) = LlmirRep(model, backend).run([X])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_bad_round_mode_is_one_clear_error() -> None:
    with pytest.raises(InputError, match=r"Cast round_mode 'sideways'"):
        import_onnx(_cast(T.FLOAT8E8M0, round_mode="sideways"))


@pytest.mark.parametrize("dt", [DType.i2, DType.u2, DType.i4, DType.u4, DType.f4e2m1])
def test_sub_byte_packing_is_onnx_packing(dt: DType) -> None:
    rng = np.random.default_rng(0)
    for n in (1, 3, 4, 7, 16):
        codes = rng.integers(0, 1 << dt.bits, n).astype(np.uint8)
        arr = codes.view(numpy_dtype(dt))
        raw = pack_sub_byte(arr, dt.bits)
        assert raw == nh.from_array(arr).raw_data
        back = unpack_sub_byte(raw, dt, (n,))
        assert back.dtype == arr.dtype
        np.testing.assert_array_equal(back.view(np.uint8), codes)


def _io_model() -> onnx.ModelProto:
    """int2, uint16 and float8e4m3fnuz inputs; float, int2, uint2 and float8e8m0 outputs."""
    g = h.make_graph(
        [
            h.make_node("Cast", ["a"], ["af"], to=T.FLOAT),
            h.make_node("Cast", ["b"], ["bf"], to=T.FLOAT),
            h.make_node("Cast", ["c"], ["cf"], to=T.FLOAT),
            h.make_node("Add", ["af", "bf"], ["s"]),
            h.make_node("Add", ["s", "cf"], ["f"]),
            h.make_node("Cast", ["af"], ["i2"], to=T.INT2),
            h.make_node("Cast", ["b"], ["u2"], to=T.UINT2),  # int -> int wraps
            h.make_node("Cast", ["cf"], ["e"], to=T.FLOAT8E8M0),
        ],
        "io",
        [
            h.make_tensor_value_info("a", T.INT2, [5]),
            h.make_tensor_value_info("b", T.UINT16, [5]),
            h.make_tensor_value_info("c", T.FLOAT8E4M3FNUZ, [5]),
        ],
        [
            h.make_tensor_value_info("f", T.FLOAT, [5]),
            h.make_tensor_value_info("i2", T.INT2, [5]),
            h.make_tensor_value_info("u2", T.UINT2, [5]),
            h.make_tensor_value_info("e", T.FLOAT8E8M0, [5]),
        ],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 25)])


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_run_reads_and_writes_sub_byte_and_fnuz_tensors(tmp_path: Path, backend: str) -> None:
    onnx.save(_io_model(), tmp_path / "m.onnx")
    r = CliRunner().invoke(
        app, ["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.llmir")]
    )
    assert r.exit_code == 0, r.stderr
    feeds = {
        "a": np.array([-2, -1, 0, 1, 1]).astype(ml_dtypes.int2),
        "b": np.array([0, 1, 2, 3, 65535], np.uint16),
        "c": np.array([0.25, 0.5, 1, 2, 240], np.float32).astype(ml_dtypes.float8_e4m3fnuz),
    }
    args = ["run", str(tmp_path / "m.llmir"), "-o", str(tmp_path / "out"), "--backend", backend]
    for k, v in feeds.items():
        if v.dtype == np.uint16:
            np.save(tmp_path / f"{k}.npy", v)
            args += ["--input", f"{k}={tmp_path / f'{k}.npy'}"]
        else:
            (tmp_path / f"{k}.pb").write_bytes(nh.from_array(v, k).SerializeToString())
            args += ["--input", f"{k}={tmp_path / f'{k}.pb'}"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["e.pb", "f.npy", "i2.pb", "u2.pb"]
    (want_f, want_i2, want_u2, want_e) = ReferenceEvaluator(_io_model()).run(None, feeds)
    np.testing.assert_array_equal(np.load(out / "f.npy"), want_f)
    for name, want in (("i2", want_i2), ("u2", want_u2), ("e", want_e)):
        t = onnx.TensorProto()
        t.ParseFromString((out / f"{name}.pb").read_bytes())
        got = nh.to_array(t)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), name)
