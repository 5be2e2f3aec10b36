"""Backends: an llmir module to an artifact a runtime loads.

`build(module, out_dir, target)` dispatches on the target; each backend module is imported only
when its target is built, so a missing runtime library matters only for that target.
"""

from __future__ import annotations

from typing import Any

from llmir_core.errors import InputError
from llmir_core.ir.core import Module

TARGETS = ("onnxruntime",)


def build(module: Module, out_dir: str, target: str = "onnxruntime", *,
          source_path: str | None = None) -> dict[str, Any]:
    """Build an artifact folder for `target`; return its manifest."""
    if target == "onnxruntime":
        from .ort import build as build_ort
        from .ort_lower import BuildError

        try:
            return build_ort(module, out_dir, target, source_path=source_path)
        except BuildError as exc:
            src = source_path or module.source
            if not src or exc.message.startswith(src) or exc.diagnostics:
                raise
            raise BuildError(f"{src}: {exc.message}", hint=exc.hint) from None  # name the file built
    raise InputError(f"unknown target '{target}' (known: {', '.join(TARGETS)})",
                     hint="use --target onnxruntime")


__all__ = ["build", "TARGETS"]
