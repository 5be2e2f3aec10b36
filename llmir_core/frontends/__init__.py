"""Frontends: ONNX, Hugging Face folders and GGUF files to llmir modules.

`import_model(path)` picks the frontend from the input: an `.onnx` file, a folder with a
`config.json` (Hugging Face), or a `.gguf` file. Each frontend module is imported only when its
kind of input is imported, so a missing optional library matters only for that kind.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any

from llmir_core.errors import InputError
from llmir_core.fileio import atomic_write
from llmir_core.interrupts import caused_by_interrupt
from llmir_core.ir.core import Module
from llmir_core.runtime import trace_attrs
from llmir_core.tracing import traced


def detect_kind(path: str) -> str:
    """'onnx', 'hf' or 'gguf' for a model path; InputError otherwise."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder", hint="check the path")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return "hf"
        onnx_files = sorted(f for f in os.listdir(path) if f.endswith(".onnx"))
        if len(onnx_files) == 1:
            return "onnx"
        raise InputError(
            f"{path}: a folder without config.json (not a Hugging Face model folder)",
            hint="pass an .onnx or .gguf file, or a folder with config.json",
        )
    lower = path.lower()
    if lower.endswith(".onnx"):
        return "onnx"
    if lower.endswith(".gguf"):
        return "gguf"
    raise InputError(
        f"{path}: unknown model format (expected .onnx, .gguf or a folder with config.json)"
    )


def _frontend(kind: str) -> Any:
    try:
        if kind == "onnx":
            from .onnx import import_onnx

            return import_onnx
        if kind == "hf":
            from .hf import import_hf

            return import_hf
        from .gguf import import_gguf

        return import_gguf
    except ImportError as exc:
        if caused_by_interrupt(exc):  # a Ctrl-C during the import, not a missing package
            raise KeyboardInterrupt from None
        raise InputError(
            f"the {kind} frontend is not available: {exc}",
            hint="install llmir with its optional dependencies",
        ) from None


@traced("import", trace_attrs.import_args, trace_attrs.imported)
def import_model(
    path: str | os.PathLike[str],
    *,
    keep_unknown: bool = False,
    out_path: str | os.PathLike[str] | None = None,
    require_tokenizer: bool = True,
) -> Module:
    """Import a model into an llmir Module.

    With `out_path`, also write it there (and any weights file the frontend needs beside it),
    atomically: on any error no output file is left behind.
    """
    src = os.fspath(path)
    kind = detect_kind(src)
    if kind == "onnx" and os.path.isdir(src):
        src = os.path.join(src, next(f for f in sorted(os.listdir(src)) if f.endswith(".onnx")))
    out = os.fspath(out_path) if out_path is not None else None
    if out is not None:
        folder = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(folder):
            raise InputError(
                f"{out}: folder {folder} does not exist",
                hint="create the folder first or pick another output path",
            )
    fn = _frontend(kind)
    sidecar = None
    if kind == "onnx":
        module, sidecar = fn(src, out_path=out, keep_unknown=keep_unknown)
    else:
        kwargs: dict[str, Any] = {}
        params = inspect.signature(fn).parameters
        if "keep_unknown" in params:
            kwargs["keep_unknown"] = keep_unknown
        if "out_path" in params and out is not None:
            kwargs["out_path"] = out
        if "require_tokenizer" in params:
            kwargs["require_tokenizer"] = require_tokenizer
        module = fn(src, **kwargs)
    if out is not None:
        write_module(module, out, sidecar)
    return module


def write_module(module: Module, out: str, sidecar: Any = None) -> None:
    """Write the module's text (and its weights file, if any); nothing is left on failure."""
    from llmir_core.ir.printer import print_module

    text = print_module(module)
    side_path = None
    if sidecar is not None:
        side_path = os.path.join(os.path.dirname(os.path.abspath(out)), sidecar.name)
        with atomic_write(side_path, "wb") as fh:
            sidecar.write(fh)
    try:
        with atomic_write(out, "w") as fh:
            fh.write(text)
    except BaseException:
        if side_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(side_path)
        raise
    module.source = os.path.abspath(out)


__all__ = ["import_model", "detect_kind", "write_module"]
