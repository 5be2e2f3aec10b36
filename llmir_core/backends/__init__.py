"""Backends: an llmir module to an artifact a runtime loads.

`build(module, out_dir, target)` dispatches on the target; each backend module is imported only
when its target is built, so a missing runtime library matters only for that target.
"""

from __future__ import annotations

from typing import Any

from llmir_core.errors import InputError
from llmir_core.ir.core import Module
from llmir_core.runtime import trace_attrs
from llmir_core.tracing import traced

TARGETS = ("onnxruntime",)


@traced("build", trace_attrs.build_args, trace_attrs.built)
def build(module: Module, out_dir: str, target: str = "onnxruntime", *,
          source_path: str | None = None) -> dict[str, Any]:
    """Build an artifact folder for `target`; return its manifest."""
    if target == "onnxruntime":
        from .ort import build as build_ort

        return build_ort(module, out_dir, target, source_path=source_path)
    raise InputError(f"unknown target '{target}' (known: {', '.join(TARGETS)})",
                     hint="use --target onnxruntime")


__all__ = ["build", "TARGETS"]
