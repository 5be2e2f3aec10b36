"""Span attributes of the runtime stages (see `llmir_core.tracing`): what a trace says about a
model, an artifact, a loaded decoder and its KV cache. Pure functions of their arguments, cheap,
and only called while tracing is on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from llmir_core import tracing


def kv_cache_bytes(decoder: Any) -> int | None:
    """Bytes the decoder's KV cache holds now (its preallocated buffers, or the cached tensors)."""
    for attr in ("buffers", "cache"):
        arrays = getattr(decoder, attr, None)
        if arrays:
            try:
                return int(sum(int(a.nbytes) for a in arrays))
            except (AttributeError, TypeError):
                return None
    return None


def manifest_attrs(manifest: Mapping[str, Any], art_dir: str | None = None) -> dict[str, Any]:
    """Attributes of an artifact: model name, target, quantization, KV-cache layout, size."""
    dec = manifest.get("decoder") or {}
    src = (manifest.get("source") or {}).get("file")
    model = dec.get("architecture") if not src else os.path.splitext(str(src))[0]
    if art_dir is not None and not model:
        model = os.path.basename(os.path.abspath(art_dir))
    files = manifest.get("files") or {}
    quant = dec.get("quant") or {}
    return {
        "gen_ai.request.model": model,
        "gen_ai.system": "llmir",
        "llmir.target": manifest.get("target"),
        "llmir.artifact": os.path.abspath(art_dir) if art_dir else None,
        "llmir.artifact.bytes": sum(
            int(f.get("bytes", 0)) for f in files.values() if isinstance(f, dict)
        )
        or None,
        "llmir.quantization": quant.get("f32_weights"),
        "llmir.quantization.gguf": sorted(
            {**(quant.get("gguf_lossless") or {}), **(quant.get("gguf_exact") or {})}
        )
        or None,
        "llmir.accuracy_level": dec.get("accuracy_level"),
        "llmir.kv_cache": dec.get("kv_cache"),
        "llmir.layers": dec.get("layers"),
        "llmir.max_len": dec.get("max_len"),
    }


def loaded(decoder: Any) -> dict[str, Any]:
    """After an artifact is opened: its attributes also go on every later span of the command."""
    manifest = getattr(decoder, "manifest", None) or {}
    attrs = manifest_attrs(manifest, getattr(decoder, "art_dir", None))
    attrs["llmir.threads"] = getattr(decoder, "threads", None)
    attrs["llmir.spin"] = getattr(decoder, "spin", None)
    tracing.set_common(
        {
            k: attrs[k]
            for k in (
                "gen_ai.request.model",
                "gen_ai.system",
                "llmir.target",
                "llmir.quantization",
                "llmir.threads",
                "llmir.spin",
            )
        }
    )
    return attrs


def built(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """After a build: the artifact's attributes."""
    return manifest_attrs(manifest) if isinstance(manifest, Mapping) else {}


def build_args(module: Any, out_dir: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Before a build: what is built, where, for which target and precision."""
    return {
        "llmir.module": getattr(module, "name", None),
        "llmir.output": os.path.abspath(str(out_dir)),
        "llmir.target": kwargs.get("target")
        or (args[0] if args and isinstance(args[0], str) else "onnxruntime"),
        "llmir.quantization": kwargs.get("quant"),
        "llmir.ops": module.op_count(),
    }


def import_args(path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"llmir.source": os.fspath(path)}


def imported(module: Any) -> dict[str, Any]:
    attrs = getattr(module, "attrs", {}) or {}
    return {
        "gen_ai.request.model": getattr(module, "name", None),
        "llmir.ops": module.op_count(),
        "llmir.architecture": attrs.get("llm.architecture"),
        "llmir.output": getattr(module, "source", None),
    }


def tokenized(ids: Any) -> dict[str, Any]:
    return {"gen_ai.usage.input_tokens": len(ids)}


__all__ = [
    "kv_cache_bytes",
    "manifest_attrs",
    "loaded",
    "built",
    "build_args",
    "import_args",
    "imported",
    "tokenized",
]
