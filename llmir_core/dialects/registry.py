"""The table of known ops, filled by the dialect modules when they are imported."""

from __future__ import annotations

import difflib

from .opdef import OpDef

OPS: dict[str, OpDef] = {}
DIALECTS: dict[str, str] = {}  # name -> one-line description
CORE_DIALECTS = ("core", "llm")


def register(*defs: OpDef) -> None:
    for d in defs:
        if d.name in OPS:
            raise ValueError(f"op {d.name} registered twice")
        errs = d.declaration_errors()
        if errs:
            raise ValueError(f"op {d.name}: " + "; ".join(errs))
        OPS[d.name] = d


def register_dialect(name: str, description: str) -> None:
    DIALECTS[name] = description


def get_op(name: str) -> OpDef | None:
    _load()
    return OPS.get(name)


def all_ops() -> dict[str, OpDef]:
    _load()
    return OPS


def suggest(name: str) -> list[str]:
    _load()
    return difflib.get_close_matches(name, list(OPS), n=3, cutoff=0.6)


_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib

    from llmir_core.targets import dialect_modules

    from . import core, core_reduce, core_shape, llm, llm_moe, onnx_ext  # noqa: F401  (registration on import)

    for mod in dialect_modules():  # the targets' dialects (and plugins'), from the target table
        importlib.import_module(mod)
