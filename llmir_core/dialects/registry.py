"""The table of known ops, filled by the dialect modules when they are imported.

On first use the built-in dialects load (core, llm, the built-in targets' dialects), then the
plugins' op sets (`llmir.dialects` entry points and plugin targets' `dialects`, from
llmir_core.targets). A plugin cannot shadow a built-in op or add ops to a built-in dialect; a
plugin whose module fails to import, or that tries to, is not loaded: one warning line names
it and its package, the ops it registered before failing are removed, and llmir goes on.
"""

from __future__ import annotations

import difflib
import importlib
import sys

from .opdef import OpDef

OPS: dict[str, OpDef] = {}
DIALECTS: dict[str, str] = {}  # name -> one-line description
CORE_DIALECTS = ("core", "llm")


class PluginOpError(ValueError):
    """A plugin's op that would shadow a built-in op or join a built-in dialect."""


BUILTIN_DIALECTS: frozenset[str] = frozenset()  # known once the built-in dialects are loaded
_guarded = False  # while plugins load: the built-in dialects are closed to them


def register(*defs: OpDef) -> None:
    for d in defs:
        if _guarded and d.name in OPS and OPS[d.name].dialect in BUILTIN_DIALECTS:
            raise PluginOpError(f"op {d.name} is refused: a built-in op has that name")
        if _guarded and d.dialect in BUILTIN_DIALECTS:
            raise PluginOpError(f"op {d.name} is refused: '{d.dialect}' is a built-in dialect")
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
    global _loaded, _guarded, BUILTIN_DIALECTS
    if _loaded:
        return
    _loaded = True
    from llmir_core.targets import builtin_dialect_modules, plugin_dialect_modules

    from . import core, core_reduce, core_shape, llm, llm_moe, onnx_ext  # noqa: F401  (registration on import)

    for mod in builtin_dialect_modules():  # the built-in targets' dialects, from the table
        importlib.import_module(mod)
    # from here on, until every plugin is in, the built-in dialects are guarded (a plugin
    # target's module may register its ops when it is loaded, before its dialect module runs)
    BUILTIN_DIALECTS = frozenset(d.dialect for d in OPS.values()) | frozenset(CORE_DIALECTS)
    _guarded = True
    try:
        for mod, who in plugin_dialect_modules():
            load_plugin_ops(mod, who)
    finally:
        _guarded = False


def load_plugin_ops(module: str, who: str) -> bool:
    """Import a plugin's op-set module (its ops register on import); False, with one warning
    line naming `who`, when it fails (then none of its ops stay registered)."""
    global _guarded
    from llmir_core.targets import plugin_warning

    _load()
    ops, dialects, guarded = set(OPS), dict(DIALECTS), _guarded
    _guarded = True
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not break core
        for name in set(OPS) - ops:
            del OPS[name]
        DIALECTS.clear()
        DIALECTS.update(dialects)
        sys.modules.pop(module, None)
        lines = str(exc).strip().splitlines() or [""]
        why = lines[0] if isinstance(exc, PluginOpError) else f"{type(exc).__name__}: {lines[0]}"
        plugin_warning(f"{who} is not loaded ({module}): {why}")
        return False
    finally:
        _guarded = guarded
    return True
