"""Running a model on tensors from files: the core of `llmir run --input NAME=FILE`.

A target is an artifact folder (built by `llmir build`, run on onnxruntime) or a `.llmir` file (run
on the numpy reference interpreter, or built into a temp folder and run on onnxruntime). Inputs are
checked against the model's signature first (missing or extra names, dtype, rank, static dims and
symbolic dims bound consistently), so a wrong input gets one clear line instead of a runtime error.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.errors import InputError
from llmir_core.ir.core import Module
from llmir_core.ir.dims import DYN, Dim, SymDim, eval_dim, format_dim
from llmir_core.ir.typeparse import TypeSyntaxError, parse_dim_expr
from llmir_core.ir.types import DTYPE_NAMES, DType, TensorType, numpy_dtype
from llmir_core.tracing import traced  # tracing

BACKENDS = ("reference", "onnxruntime")


@dataclass(frozen=True)
class TensorSig:
    """One input or output: its name, dtype and dims (ints, symbolic dims or `?`)."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...]

    def describe(self) -> str:
        return f"{self.name}: {TensorType(self.shape, self.dtype)}"


def module_signature(module: Module) -> tuple[list[TensorSig], list[TensorSig]]:
    fn = module.main
    in_names = list(fn.attrs.get("input_names") or [a.name for a in fn.args])
    out_names = list(fn.attrs.get("output_names") or [v.name for v in fn.outputs])
    ins, outs = [], []
    for n, a in zip(in_names, fn.args):
        t = a.type
        if not isinstance(t, TensorType) or not isinstance(t.dtype, DType):
            raise InputError(f"input {n} has type {t}; `llmir run` takes plain tensors only")
        ins.append(TensorSig(n, t.dtype, t.shape))
    for n, v in zip(out_names, fn.outputs):
        t = v.type
        if isinstance(t, TensorType) and isinstance(t.dtype, DType):
            outs.append(TensorSig(n, t.dtype, t.shape))
    return ins, outs


def manifest_signature(manifest: Mapping[str, Any]) -> tuple[list[TensorSig], list[TensorSig]]:
    def parse(entries: list[dict[str, Any]]) -> list[TensorSig]:
        out = []
        for e in entries:
            dims: list[Dim] = []
            for d in e["shape"]:
                if isinstance(d, int):
                    dims.append(d)
                else:
                    try:
                        dims.append(parse_dim_expr(str(d)))
                    except TypeSyntaxError:
                        dims.append(DYN)
            out.append(TensorSig(e["name"], DTYPE_NAMES[e["dtype"]], tuple(dims)))
        return out

    return parse(list(manifest["inputs"])), parse(list(manifest["outputs"]))


def _single_name(d: Dim) -> str | None:
    if isinstance(d, SymDim) and d.const == 0 and len(d.terms) == 1:
        ((mono, coef),) = d.terms
        if coef == 1 and len(mono) == 1:
            return mono[0]
    return None


def check_inputs(sigs: list[TensorSig], inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Check names, dtypes and shapes against the signature; return the bound symbolic dims."""
    names = [s.name for s in sigs]
    missing = [n for n in names if n not in inputs]
    extra = [n for n in inputs if n not in names]
    want = "; ".join(s.describe() for s in sigs)
    if extra:  # named first: a misspelt name is usually why another one is missing
        also = f" (and missing: {', '.join(missing)})" if missing else ""
        raise InputError(
            f"unknown input(s): {', '.join(extra)}{also}", hint=f"the model takes {want}"
        )
    if missing:
        raise InputError(f"missing input(s): {', '.join(missing)}", hint=f"the model takes {want}")
    env: dict[str, int] = {}
    where: dict[str, str] = {}
    deferred: list[tuple[TensorSig, int, Dim, int]] = []
    for s in sigs:
        v = inputs[s.name]
        if v.dtype != numpy_dtype(s.dtype):
            raise InputError(
                f"input {s.name} has dtype {v.dtype}, expected {s.dtype} ({numpy_dtype(s.dtype)})",
                hint=f"convert it, e.g. numpy: x.astype('{numpy_dtype(s.dtype)}')",
            )
        if v.ndim != len(s.shape):
            raise InputError(
                f"input {s.name} has shape {list(v.shape)} (rank {v.ndim}), expected rank "
                f"{len(s.shape)}: {TensorType(s.shape, s.dtype)}"
            )
        for i, (actual, d) in enumerate(zip(v.shape, s.shape)):
            if isinstance(d, int):
                if actual != d:
                    raise InputError(
                        f"input {s.name} dim {i} is {actual}, expected {d} "
                        f"({TensorType(s.shape, s.dtype)})"
                    )
                continue
            name = _single_name(d)
            if name is None:
                if d is not DYN:
                    deferred.append((s, i, d, actual))
                continue
            if name in env and env[name] != actual:
                raise InputError(
                    f"input {s.name} dim {i} is {actual}, but ?{name} is {env[name]} "
                    f"(from {where[name]})",
                    hint=f"every ?{name} must be the same size",
                )
            env.setdefault(name, actual)
            where.setdefault(name, f"{s.name} dim {i}")
    for s, i, d, actual in deferred:
        val = eval_dim(d, env)
        if val is not None and val != actual:
            raise InputError(
                f"input {s.name} dim {i} is {actual}, expected {format_dim(d)} = {val}"
            )
    return env


# -- loading and writing ---------------------------------------------------------------------------


def load_tensor(path: str) -> np.ndarray:
    """A tensor from a .npy file or an ONNX TensorProto .pb file."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file", hint="check the path after NAME=")
    if path.endswith(".pb"):
        from llmir_core.frontends.onnx import load_tensor_pb

        return load_tensor_pb(path)
    try:
        # memory-mapped first: a header declaring more data than the file holds fails here,
        # naming the file, instead of allocating the declared size
        with np.errstate(over="raise"):  # a shape whose size overflows: FloatingPointError
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        if isinstance(arr, np.memmap):
            arr = np.array(arr)
    except Exception as exc:  # numpy parses the header with ast/tokenize: many error types
        if "mmap length" in str(exc) or isinstance(
            exc, (OverflowError, MemoryError, FloatingPointError)
        ):
            raise InputError(
                f"{path}: truncated .npy file: its header declares more data than the file holds",
                hint="save the tensor again with numpy.save",
            ) from None
        if "descr" in str(
            exc
        ):  # e.g. '<f1': an ml_dtypes float8 array numpy.save wrote but cannot read
            raise InputError(
                f"{path}: a .npy file whose element type numpy cannot read back: {exc}",
                hint=_PB_HINT,
            ) from None
        raise InputError(
            f"{path}: not a readable .npy file: {exc}",
            hint="save tensors with numpy.save, or as ONNX TensorProto .pb",
        ) from None
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{path}: holds several arrays (.npz); pass one .npy per input")
    if arr.dtype.kind == "V":  # bfloat16/float8/int4 saved by numpy.save lose their type: raw bytes
        raise InputError(
            f"{path}: a .npy file of untyped {arr.dtype.itemsize}-byte elements ('{arr.dtype.str}'), "
            "as numpy.save writes bfloat16, float8 and int4 arrays",
            hint=_PB_HINT,
        )
    return arr


_PB_HINT = (
    "save such tensors as ONNX TensorProto .pb: "
    "open(f, 'wb').write(onnx.numpy_helper.from_array(arr).SerializeToString())"
)


def needs_pb(arr: np.ndarray) -> bool:
    """True when a .npy file cannot carry this array's element type (numpy.save writes bfloat16,
    float8, float4 and int4/uint4/int2/uint2 from ml_dtypes as untyped bytes or a descr numpy
    cannot load)."""
    return np.dtype(arr.dtype).isbuiltin != 1  # 2: a user-defined (ml_dtypes) type


def parse_input_specs(specs: list[str]) -> dict[str, np.ndarray]:
    """`NAME=FILE` pairs to arrays."""
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise InputError(
                f"--input {spec!r}: expected NAME=FILE", hint="e.g. --input input_ids=ids.npy"
            )
        if name in out:
            raise InputError(f"--input {name} given twice")
        out[name] = load_tensor(path)
    return out


def output_file_name(name: str, ext: str = ".npy") -> str:
    return (re.sub(r"[^\w.-]", "_", name).lstrip(".") or "output") + ext


def write_outputs(outputs: Mapping[str, np.ndarray], out_dir: str) -> list[str]:
    """Write each output as NAME.npy (NAME.pb for types .npy cannot carry) into out_dir, all or
    nothing: on a failure the files written so far and any folder made for them are removed."""
    made = _missing_folders(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        _remove_folders(made)
        raise InputError(f"{out_dir}: cannot create the output folder: {exc.strerror}") from None
    paths: list[str] = []
    try:
        with contextlib.ExitStack() as stack:  # every temp file renamed into place at the end
            for name, arr in outputs.items():
                paths.append(_write_output(stack, name, np.asarray(arr), out_dir))
    except BaseException:
        _remove_folders(made)
        raise
    return paths


def _write_output(stack: contextlib.ExitStack, name: str, a: np.ndarray, out_dir: str) -> str:
    from llmir_core.fileio import atomic_write

    if needs_pb(a):  # .npy cannot carry the type: an ONNX TensorProto keeps it
        import onnx.numpy_helper

        p = os.path.join(out_dir, output_file_name(name, ".pb"))
        data = onnx.numpy_helper.from_array(a, name).SerializeToString()
        stack.enter_context(atomic_write(p, "wb")).write(data)
    else:
        p = os.path.join(out_dir, output_file_name(name))
        np.save(stack.enter_context(atomic_write(p, "wb")), a, allow_pickle=False)
    return p


def _missing_folders(path: str) -> list[str]:
    """The folders os.makedirs(path) would create, deepest first."""
    out = []
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        out.append(p)
        p = os.path.dirname(p)
    return out


def _remove_folders(folders: list[str]) -> None:
    if folders:  # the topmost one made, with everything in it
        shutil.rmtree(folders[-1], ignore_errors=True)


def summarize(outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    rows = []
    for name, arr in outputs.items():
        a = np.asarray(arr)
        row: dict[str, Any] = {"name": name, "shape": list(a.shape), "dtype": str(a.dtype)}
        if a.size and (a.dtype.kind in "biuf" or needs_pb(a)):  # ml_dtypes types too
            f = a.astype(np.float64)
            row.update(
                min=float(np.nanmin(f)) if not np.isnan(f).all() else float("nan"),
                max=float(np.nanmax(f)) if not np.isnan(f).all() else float("nan"),
                mean=float(np.mean(f)),
            )
        rows.append(row)
    return rows


# -- running ----------------------------------------------------------------------------------------


def run_module(module: Module, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run on the reference interpreter; inputs and outputs keyed by the model's I/O names."""
    from llmir_core.interp import run

    ins, _ = module_signature(module)
    check_inputs(ins, inputs)
    fn = module.main
    by_arg = {a.name: inputs[s.name] for a, s in zip(fn.args, ins)}
    outs = run(module, by_arg)
    names = list(fn.attrs.get("output_names") or [v.name for v in fn.outputs])
    return dict(zip(names, [np.asarray(o) for o in outs]))


@traced(
    "run",
    lambda target, inputs, backend="reference", threads=None: {  # tracing
        "llmir.backend": backend,
        "llmir.input": target,
        "llmir.threads": threads,
    },
)
def run_target(
    target: str,
    inputs: Mapping[str, np.ndarray],
    backend: str = "reference",
    threads: int | None = None,
) -> dict[str, np.ndarray]:
    """Run an artifact folder or a .llmir file on `backend`."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend '{backend}' (known: {', '.join(BACKENDS)})")
    if os.path.isdir(target):
        if backend != "onnxruntime":
            raise InputError(
                f"{target}: an artifact folder runs on onnxruntime",
                hint="pass --backend onnxruntime, or run the .llmir file on the reference",
            )
        from llmir_core.targets import open_artifact, read_manifest

        manifest = read_manifest(target)
        ins, _ = manifest_signature(manifest)
        check_inputs(ins, inputs)
        return dict(open_artifact(target, threads=threads, tensors=True).run(inputs))
    from llmir_core.ir.parser import parse_file
    from llmir_core.verifier import require_verified

    module = parse_file(target)
    require_verified(module, target)  # weights inside their files, static shapes, pinned sha256
    if backend == "reference":
        return run_module(module, inputs)
    ins, _ = module_signature(module)
    check_inputs(ins, inputs)
    from llmir_core.targets import build, open_artifact

    with tempfile.TemporaryDirectory(prefix="llmir-run-") as tmp:
        art = os.path.join(tmp, "artifact")
        build(module, art, backend, source_path=target)
        return dict(open_artifact(art, threads=threads, tensors=True).run(inputs))


__all__ = [
    "TensorSig",
    "module_signature",
    "manifest_signature",
    "check_inputs",
    "load_tensor",
    "parse_input_specs",
    "write_outputs",
    "needs_pb",
    "summarize",
    "run_module",
    "run_target",
    "BACKENDS",
]
