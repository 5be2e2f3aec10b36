"""The onnxruntime backend: an llmir module to an ONNX model plain onnxruntime loads.

`build(module, out_dir)` writes `model.onnx` (the graph, opset 23), `model.onnx.data` (every
weight and every constant of 1 KiB or more, as ONNX external data; never inline, so protobuf's
2 GB limit is never hit) and `manifest.json`, atomically (a temp folder renamed into place) and
deterministically (the same input gives byte-identical files). The op-by-op lowering lives in
`ort_lower.py`; opening and running an artifact (onnxruntime only, no onnx) in `ort_runtime.py`.
"""

from __future__ import annotations

import os
from typing import Any

import onnx
from onnx import helper

from llmir_core import __version__
from llmir_core.artifact import MANIFEST, ArtifactWriter, manifest_head, source_digest
from llmir_core.errors import BuildError, InputError
from llmir_core.ir.core import Module, Value
from llmir_core.ir.dims import format_dim
from llmir_core.ir.types import DType, KVCacheType, TensorType
from llmir_core.targets.onnxruntime.onnx_lower import (
    MS,
    OPSET,
    DataPlan,
    Lowering,
    onnx_dtype,
    value_info,
)
from llmir_core.targets.onnxruntime.session import OrtRunner

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"


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
    with ArtifactWriter(out_dir) as w:
        model, plan, inputs, outputs = to_onnx(module)
        fn = module.main
        if source is None:
            sha, name = source_digest(module, source_path)
            source = {"file": name or "", "sha256": sha}
        if plan.chunks:
            w.add(DATA_FILE, plan.write(w.path(DATA_FILE)))
        w.write_bytes(MODEL_FILE, model.SerializeToString(deterministic=True))
        head = manifest_head(
            target,
            model=MODEL_FILE,
            source=source,
            pipeline=module.attrs.get("llmir.pipeline"),
            lowered=w.write_lowered(lowered_text),
            target_options=module.attrs.get("llmir.target_options"),
        )
        return w.finish(
            {
                **head,
                "opset": {d.domain or "ai.onnx": d.version for d in model.opset_import},
                "inputs": _signature(inputs, fn.args),
                "outputs": _signature(outputs, fn.outputs),
            }
        )


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
