"""Opening and running onnxruntime artifacts: sessions, numpy <-> OrtValue, the tensor runner.

What `run`, `serve` and `bench` need to load an artifact someone built, and nothing more: this
module imports onnxruntime (lazily) and never onnx, so loading a model does not pay for the
builder's libraries (tests/decoder/test_open_imports.py checks it). Building (`ort.py`,
`ort_lower.py`, `ort_decoder.py`) is where onnx is used. The artifact's files are checked
against its manifest in one place, `llmir_core.artifact_check.open_checked` (through
`llmir_core.targets.open_artifact` or `load_manifest` here).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from llmir_core.errors import BuildError, InputError
from llmir_core.ir.types import DType, numpy_dtype
from llmir_core.tracing import traced  # tracing

MODEL_FILE = "model.onnx"


def _ort() -> Any:
    import onnxruntime as ort

    # onnxruntime's own log lines (coloured whatever NO_COLOR says) stay off: a failure reaches
    # llmir as an exception, reported in its one-line form
    ort.set_default_logger_severity(4)
    return ort


def _session(model: str | bytes, threads: int | None = None, custom_ops: Any = ()) -> Any:
    ort = _ort()
    so = ort.SessionOptions()
    so.log_severity_level = 4  # errors reach llmir as exceptions; no coloured log lines
    if custom_ops:  # the llmir custom-op libraries the manifest names
        from llmir_core.targets.onnxruntime.native import register

        register(so, custom_ops)
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        where = f"{model}: " if isinstance(model, str) else ""  # a file names where it failed
        raise BuildError(
            f"{where}onnxruntime cannot load the model: {str(exc).strip().splitlines()[0]}"
        ) from None


# ONNX TensorProto element types (the numbers of onnx.TensorProto.DataType, spelled here so
# this module needs no onnx) of the dtypes onnxruntime's numpy bridge cannot carry (ml_dtypes
# types): they pass as raw bytes, sub-byte types packed as ONNX stores them
_EXOTIC: dict[DType, tuple[int, str]] = {
    DType.bf16: (16, "bfloat16"),
    DType.f8e4m3: (17, "float8e4m3fn"),
    DType.f8e4m3fnuz: (18, "float8e4m3fnuz"),
    DType.f8e5m2: (19, "float8e5m2"),
    DType.f8e5m2fnuz: (20, "float8e5m2fnuz"),
    DType.u4: (21, "uint4"),
    DType.i4: (22, "int4"),
    DType.f4e2m1: (23, "float4e2m1"),
    DType.f8e8m0: (24, "float8e8m0"),
    DType.u2: (25, "uint2"),
    DType.i2: (26, "int2"),
}
_BY_ORT_NAME = {f"tensor({name})": dt for dt, (_, name) in _EXOTIC.items()}


def _ort_value(arr: np.ndarray) -> Any:
    """numpy -> OrtValue, passing the types onnxruntime's numpy bridge lacks as raw bytes
    (sub-byte types packed as ONNX stores them)."""
    import ctypes

    from llmir_core.ir.types import dtype_from_numpy, pack_sub_byte

    ort = _ort()
    arr = np.ascontiguousarray(arr)
    if np.dtype(arr.dtype).isbuiltin == 1:
        return ort.OrtValue.ortvalue_from_numpy(arr)
    dt = dtype_from_numpy(arr.dtype)
    if dt not in _EXOTIC:
        raise BuildError(f"onnxruntime's Python API cannot take {arr.dtype.name} inputs")
    raw = pack_sub_byte(arr, dt.bits) if dt.bits < 8 else arr.tobytes()
    v = ort.OrtValue.ortvalue_from_shape_and_type(list(arr.shape), _EXOTIC[dt][0])
    if raw:
        ctypes.memmove(v.data_ptr(), raw, len(raw))
    return v


def _from_ort_value(v: Any) -> np.ndarray:
    dt = _BY_ORT_NAME.get(v.data_type())
    if dt is None:
        return np.asarray(v.numpy())
    import ctypes

    from llmir_core.ir.types import unpack_sub_byte

    shape = tuple(v.shape())
    n = int(np.prod(shape)) if shape else 1
    nbytes = (n * dt.bits + 7) // 8
    raw = bytes((ctypes.c_char * nbytes).from_address(v.data_ptr())) if nbytes else b""
    if dt.bits < 8:
        return unpack_sub_byte(raw, dt, shape)
    return np.frombuffer(raw, np.uint8).view(numpy_dtype(dt)).reshape(shape).copy()


def run_session(sess: Any, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run an onnxruntime session on numpy inputs, bf16/f8/int4 included."""
    feeds = {k: _ort_value(np.asarray(v)) for k, v in inputs.items()}
    return [_from_ort_value(o) for o in sess.run_with_ort_values(None, feeds)]


class OrtRunner:
    """An onnxruntime session over an artifact folder or an in-memory model."""

    def __init__(
        self, model: str | bytes, threads: int | None = None, custom_ops: Any = ()
    ) -> None:
        self.sess = _session(model, threads, custom_ops)
        self.input_names = [i.name for i in self.sess.get_inputs()]
        self.output_names = [o.name for o in self.sess.get_outputs()]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            outs = run_session(self.sess, inputs)
        except BuildError:
            raise
        except Exception as exc:
            raise BuildError(f"onnxruntime failed: {str(exc).strip().splitlines()[0]}") from None
        return dict(zip(self.output_names, outs))


def load_manifest(art_dir: str) -> dict[str, Any]:
    """The artifact's manifest, after checking its files against it (llmir_core.artifact_check)."""
    from llmir_core.artifact_check import open_checked

    data = open_checked(art_dir)
    if data.get("target") != "onnxruntime":
        raise InputError(f"{art_dir}: artifact target is {data.get('target')!r}, not onnxruntime")
    return data


@traced(
    "load",
    lambda art_dir, threads=None, manifest=None: {
        "llmir.artifact": art_dir,
        "llmir.threads": threads,
        "llmir.target": "onnxruntime",
    },
)
def runner_for_artifact(
    art_dir: str, threads: int | None = None, manifest: dict[str, Any] | None = None
) -> OrtRunner:
    """A session on the artifact's model; `manifest`: already read and checked by the caller
    (`llmir_core.targets.open_artifact`), so the files are not checked twice."""
    if manifest is None:
        manifest = load_manifest(art_dir)
    return OrtRunner(
        os.path.join(art_dir, manifest.get("model", MODEL_FILE)),
        threads,
        manifest.get("custom_ops") or (),
    )


__all__ = [
    "BuildError",
    "OrtRunner",
    "load_manifest",
    "runner_for_artifact",
    "run_session",
    "MODEL_FILE",
]
