"""The onnxruntime backend: an llmir module to an ONNX model plain onnxruntime loads.

`build(module, out_dir)` writes `model.onnx` (the graph, opset 23), `model.onnx.data` (every
weight and every constant of 1 KiB or more, as ONNX external data; never inline, so protobuf's
2 GB limit is never hit) and `manifest.json`, atomically (a temp folder renamed into place) and
deterministically (the same input gives byte-identical files). The op-by-op lowering lives in
`ort_lower.py`. This module is the only importer of onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from llmir_core import SPEC_VERSION, __version__
from llmir_core.errors import InputError
from llmir_core.fileio import replace_dir, sha256_file
from llmir_core.ir.core import Module, Value
from llmir_core.ir.dims import format_dim
from llmir_core.ir.types import DType, KVCacheType, TensorType, numpy_dtype
from llmir_core.tracing import traced  # tracing

from .ort_lower import MS, OPSET, BuildError, DataPlan, Lowering, onnx_dtype, value_info

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
MANIFEST = "manifest.json"


# -- entry points --------------------------------------------------------------------------------------


def to_onnx(
    module: Module,
    *,
    inline_weights: bool = False,
    base_dir: str | None = None,
    fn_name: str | None = None,
) -> tuple[onnx.ModelProto, DataPlan, list[str], list[str]]:
    """Lower a module's function to an ONNX ModelProto (+ the data file's plan, I/O names)."""
    fn = module.function(fn_name) if fn_name else module.main
    base = base_dir or (
        os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
    )
    L = Lowering(module, base, inline_weights)
    for a in fn.args:
        if isinstance(a.type, KVCacheType):
            raise BuildError(
                f"input %{a.name} is a !llm.kv_cache, which the onnxruntime backend "
                "cannot take as an input yet"
            )
    input_names, output_names = L.lower_function(fn)
    graph = helper.make_graph(
        L.nodes,
        module.name or "main",
        [value_info(n, a.type) for n, a in zip(input_names, fn.args)],
        [value_info(n, v.type) for n, v in zip(output_names, fn.outputs)],
        initializer=L.inits,
    )
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(L.opsets.items())]
    model = helper.make_model(
        graph, opset_imports=opsets, producer_name="llmir", producer_version=__version__
    )
    model.ir_version = max(10, helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    return model, L.plan, input_names, output_names


def _signature(names: list[str], values: list[Value]) -> list[dict[str, Any]]:
    out = []
    for n, v in zip(names, values):
        t = v.type
        assert isinstance(t, TensorType)
        out.append(
            {
                "name": n,
                "dtype": str(t.dtype),
                "shape": [d if isinstance(d, int) else format_dim(d) for d in t.shape],
            }
        )
    return out


ARTIFACT_FORMAT = "llmir-artifact"  # the manifest's "format": marks a folder llmir built


def _artifact_manifest_problem(out_dir: str) -> str | None:
    """None when out_dir is provably an llmir artifact (a manifest that says so, and no file or
    folder the manifest does not list), else why it is not."""
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.isfile(path) or os.path.islink(path):
        return f"no {MANIFEST}"
    try:
        if os.path.getsize(path) > 64 << 20:
            return f"{MANIFEST} is too large for an llmir manifest"
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return f"{MANIFEST} is not an llmir manifest (not JSON)"
    if not isinstance(data, dict):
        return f"{MANIFEST} is not an llmir manifest (not a JSON object)"
    files = data.get("files")
    # Manifests written before the "format" marker: the fields only an llmir build writes.
    legacy = (
        isinstance(data.get("llmir_version"), str)
        and data.get("schema_version") == 1
        and isinstance(files, dict)
        and all(isinstance(f, dict) and "sha256" in f and "bytes" in f for f in files.values())
    )
    if data.get("format") != ARTIFACT_FORMAT and not legacy:
        return f"{MANIFEST} is not an llmir manifest"
    if not isinstance(files, dict) or not all(isinstance(n, str) for n in files):
        return f"{MANIFEST} lists no files"
    listed = set(files) | {MANIFEST}
    for entry in sorted(os.listdir(out_dir)):
        full = os.path.join(out_dir, entry)
        if entry not in listed:
            return f"it holds {entry!r}, which {MANIFEST} does not list"
        if os.path.islink(full) or not os.path.isfile(full):
            return f"{entry!r} is not a regular file"
    return None


def check_artifact_dir(out_dir: str) -> None:
    """Refuse an output folder llmir must not replace: its parent missing, a file, a symbolic
    link, or a non-empty folder that is not provably an llmir artifact (see
    _artifact_manifest_problem). Called before the build and again right before the swap."""
    parent = os.path.dirname(out_dir)
    if not os.path.isdir(parent):
        raise InputError(f"{out_dir}: folder {parent} does not exist", hint="create it first")
    if os.path.islink(out_dir):
        raise InputError(
            f"{out_dir}: is a symbolic link; llmir replaces the output folder as a whole",
            hint="pass the folder it points to, or a new output folder",
        )
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"{out_dir}: exists and is not a folder")
    if not os.path.isdir(out_dir):
        return
    try:
        empty = not os.listdir(out_dir)
        problem = None if empty else _artifact_manifest_problem(out_dir)
    except OSError as exc:
        problem = f"cannot read it ({exc.strerror or exc})"
    if problem:
        raise InputError(
            f"{out_dir}: folder exists, is not empty and is not an llmir artifact: {problem}",
            hint="pick a new output folder; llmir only replaces a folder holding nothing but "
            "an artifact it built",
        )


def source_digest(module: Module, source_path: str | None) -> tuple[str, str | None]:
    """(sha256, file name) of the .llmir the artifact is built from (of its text when unsaved)."""
    src = source_path or module.source
    if src and os.path.isfile(src):
        return sha256_file(src), os.path.basename(src)
    from llmir_core.ir.printer import print_module

    return hashlib.sha256(print_module(module).encode()).hexdigest(), None


def artifact_tmp_dir(out_dir: str) -> str:
    """A temp folder beside out_dir to build into (then `replace_dir`), with ordinary permissions."""
    try:
        tmp = tempfile.mkdtemp(
            prefix=f".{os.path.basename(out_dir)}.", suffix=".tmp", dir=os.path.dirname(out_dir)
        )
    except OSError as exc:  # a read-only or full disk, no permission: the user's to fix
        raise InputError(
            f"{out_dir}: cannot create the artifact in {os.path.dirname(out_dir)}: {exc.strerror}",
            hint="write the artifact somewhere else (-o DIR)",
        ) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the artifact is an ordinary folder
    return tmp


def build(
    module: Module,
    out_dir: str,
    target: str = "onnxruntime",
    *,
    source_path: str | None = None,
    source: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write an onnxruntime artifact for the module into out_dir (the generic op-by-op lowering);
    return its manifest. `source` ({file, sha256}) names the module it was lowered from."""
    if target != "onnxruntime":
        raise InputError(
            f"unknown target '{target}'", hint="the onnxruntime backend builds --target onnxruntime"
        )
    out_dir = os.path.abspath(out_dir)
    check_artifact_dir(out_dir)
    model, plan, inputs, outputs = to_onnx(module)
    fn = module.main
    if source is not None:
        src_sha, src_name = source["sha256"], source.get("file") or None
    else:
        src_sha, src_name = source_digest(module, source_path)
    tmp = artifact_tmp_dir(out_dir)
    try:
        files = [MODEL_FILE]
        digests: dict[str, str] = {}
        if plan.chunks:
            digests[DATA_FILE] = plan.write(os.path.join(tmp, DATA_FILE))
            files.append(DATA_FILE)
        with open(os.path.join(tmp, MODEL_FILE), "wb") as fh:
            fh.write(model.SerializeToString(deterministic=True))
        manifest: dict[str, Any] = {
            "format": ARTIFACT_FORMAT,
            "schema_version": 1,
            "llmir_version": __version__,
            "spec_version": SPEC_VERSION,
            "target": target,
            "opset": {d.domain or "ai.onnx": d.version for d in model.opset_import},
            "model": MODEL_FILE,
            "source": {"file": src_name, "sha256": src_sha},
            "inputs": _signature(inputs, fn.args),
            "outputs": _signature(outputs, fn.outputs),
            "files": {
                f: {
                    "sha256": digests.get(f) or sha256_file(os.path.join(tmp, f)),
                    "bytes": os.path.getsize(os.path.join(tmp, f)),
                }
                for f in files
            },
        }
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        replace_dir(tmp, out_dir, guard=check_artifact_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


# -- running ----------------------------------------------------------------------------------------------


def _session(model: str | bytes, threads: int | None = None) -> Any:
    import onnxruntime as ort

    # onnxruntime's own log lines (coloured whatever NO_COLOR says) stay off: a failure reaches
    # llmir as an exception, reported in its one-line form
    ort.set_default_logger_severity(4)
    so = ort.SessionOptions()
    so.log_severity_level = 4  # errors reach llmir as exceptions; no coloured log lines
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise BuildError(
            f"onnxruntime cannot load the model: {str(exc).strip().splitlines()[0]}"
        ) from None


_SPECIAL_IN = {
    "bfloat16": TensorProto.BFLOAT16,
    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN,
    "float8_e5m2": TensorProto.FLOAT8E5M2,
}
_SPECIAL_OUT = {
    "tensor(bfloat16)": (DType.bf16, 2),
    "tensor(float8e4m3fn)": (DType.f8e4m3, 1),
    "tensor(float8e5m2)": (DType.f8e5m2, 1),
    "tensor(int4)": (DType.i4, 0),
    "tensor(uint4)": (DType.u4, 0),
}


def _ort_value(arr: np.ndarray) -> Any:
    """numpy -> OrtValue, passing the types onnxruntime's numpy bridge lacks as raw bytes."""
    import onnxruntime as ort

    arr = np.ascontiguousarray(arr)
    code = _SPECIAL_IN.get(arr.dtype.name)
    if code is not None:
        raw = arr.view(np.uint16 if arr.dtype.itemsize == 2 else np.uint8)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, onnx_element_type=code)
    if arr.dtype.name in ("int4", "uint4"):
        raise BuildError(f"onnxruntime's Python API cannot take {arr.dtype.name} inputs")
    return ort.OrtValue.ortvalue_from_numpy(arr)


def _from_ort_value(v: Any) -> np.ndarray:
    special = _SPECIAL_OUT.get(v.data_type())
    if special is None:
        return np.asarray(v.numpy())
    import ctypes

    dt, width = special
    shape = tuple(v.shape())
    n = int(np.prod(shape)) if shape else 1
    nbytes = n * width if width else (n + 1) // 2
    raw = (
        np.frombuffer(bytes((ctypes.c_char * nbytes).from_address(v.data_ptr())), np.uint8)
        if nbytes
        else np.zeros(0, np.uint8)
    )
    if width:
        return raw.view(numpy_dtype(dt)).reshape(shape).copy()
    lo, hi = raw & 0x0F, raw >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(-1)[:n].astype(np.int8)
    if dt == DType.i4:
        codes = np.where(codes > 7, codes - 16, codes).astype(np.int8)
    return codes.astype(numpy_dtype(dt)).reshape(shape)


def run_session(sess: Any, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run an onnxruntime session on numpy inputs, bf16/f8/int4 included."""
    feeds = {k: _ort_value(np.asarray(v)) for k, v in inputs.items()}
    return [_from_ort_value(o) for o in sess.run_with_ort_values(None, feeds)]


class OrtRunner:
    """An onnxruntime session over an artifact folder or an in-memory model."""

    def __init__(self, model: str | bytes, threads: int | None = None) -> None:
        self.sess = _session(model, threads)
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


def session_for_module(
    module: Module, threads: int | None = 1
) -> tuple[OrtRunner, list[str], list[str]]:
    """Build in memory (weights inline; small models only) and open a session. Ops in a 16-bit
    float dtype the CPU provider has no kernel for compute in f32 between casts first
    (lower-ort-precision, as in `llmir build`)."""
    module = _with_cpu_kernels(module)
    model, _, inputs, outputs = to_onnx(module, inline_weights=True)
    return OrtRunner(model.SerializeToString(), threads), inputs, outputs


def _with_cpu_kernels(module: Module) -> Module:

    narrow = (DType.f16, DType.bf16)
    if not any(
        isinstance(v.type, TensorType) and v.type.dtype in narrow
        for fn in module.functions
        for op in fn.ops
        for v in op.results
    ):
        return module
    from llmir_core.passes.base import PassContext, clone_module
    from llmir_core.passes.lower_ort_precision import LowerOrtPrecision

    out = clone_module(module)
    LowerOrtPrecision().run(out, PassContext())
    return out


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
    (`llmir_core.backends.open_artifact`), so the files are not checked twice."""
    if manifest is None:
        manifest = load_manifest(art_dir)
    return OrtRunner(os.path.join(art_dir, manifest.get("model", MODEL_FILE)), threads)


__all__ = [
    "build",
    "to_onnx",
    "BuildError",
    "OrtRunner",
    "session_for_module",
    "load_manifest",
    "runner_for_artifact",
    "run_session",
    "OPSET",
    "MS",
    "Lowering",
    "onnx_dtype",
    "DataPlan",
    "MODEL_FILE",
    "DATA_FILE",
    "MANIFEST",
]
