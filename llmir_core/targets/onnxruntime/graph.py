"""The onnxruntime backend: an llmir module to an ONNX model plain onnxruntime loads.

`build(module, out_dir)` writes `model.onnx` (the graph, opset 23), `model.onnx.data` (every
weight and every constant of 1 KiB or more, as ONNX external data; never inline, so protobuf's
2 GB limit is never hit) and `manifest.json`, atomically (a temp folder renamed into place) and
deterministically (the same input gives byte-identical files). The op-by-op lowering lives in
`ort_lower.py`; opening and running an artifact (onnxruntime only, no onnx) in `ort_runtime.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from typing import Any

import onnx
from onnx import helper

from llmir_core import SPEC_VERSION, __version__
from llmir_core.errors import InputError
from llmir_core.fileio import replace_dir, sha256_file
from llmir_core.ir.core import Module, Value
from llmir_core.ir.dims import format_dim
from llmir_core.ir.types import DType, KVCacheType, TensorType
from llmir_core.targets.onnxruntime.onnx_lower import (
    MS,
    OPSET,
    BuildError,
    DataPlan,
    Lowering,
    onnx_dtype,
    value_info,
)
from llmir_core.targets.onnxruntime.session import OrtRunner

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
MANIFEST = "manifest.json"
LOWERED_FILE = "model.lowered.llmir"  # the lowered module the nodes' llmir.line tags point into


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


def _options_record(module: Module) -> dict[str, Any] | None:
    """The build options the lowering recorded (`llmir.target_options`), for the manifest."""
    rec = module.attrs.get("llmir.target_options")
    return {str(k): v for k, v in rec.items()} if isinstance(rec, dict) else None


def build(
    module: Module,
    out_dir: str,
    target: str = "onnxruntime",
    *,
    source_path: str | None = None,
    source: dict[str, str] | None = None,
    lowered_text: str | None = None,
) -> dict[str, Any]:
    """Write an onnxruntime artifact for the module into out_dir (the generic op-by-op lowering);
    return its manifest. `source` ({file, sha256}) names the module it was lowered from.
    lowered_text: the text the module was parsed from (`llmir build` lowered it), written as
    `model.lowered.llmir` (manifest `lowered`): the file the nodes' `llmir.line` tags point into,
    as in the decoder build. The manifest's `pipeline` is the module's `llmir.pipeline`."""
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
        if lowered_text is not None:
            with open(os.path.join(tmp, LOWERED_FILE), "w", encoding="utf-8", newline="") as fh:
                fh.write(lowered_text)
            files.append(LOWERED_FILE)
        pipeline = module.attrs.get("llmir.pipeline")
        manifest: dict[str, Any] = {
            "format": ARTIFACT_FORMAT,
            "schema_version": 1,
            "llmir_version": __version__,
            "spec_version": SPEC_VERSION,
            "target": target,
            "opset": {d.domain or "ai.onnx": d.version for d in model.opset_import},
            "model": MODEL_FILE,
            "source": {"file": src_name, "sha256": src_sha},
            "lowered": LOWERED_FILE if lowered_text is not None else None,
            "pipeline": [str(p) for p in pipeline] if isinstance(pipeline, (list, tuple)) else None,
            "target_options": _options_record(module),
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
    from llmir_core.targets.onnxruntime.lower_precision import LowerOrtPrecision

    out = clone_module(module)
    LowerOrtPrecision().run(out, PassContext())
    return out


__all__ = [
    "build",
    "to_onnx",
    "BuildError",
    "session_for_module",
    "OPSET",
    "MS",
    "Lowering",
    "onnx_dtype",
    "DataPlan",
    "MODEL_FILE",
    "DATA_FILE",
    "MANIFEST",
]
