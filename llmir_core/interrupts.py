"""Whether the process was asked to stop (SIGINT or SIGTERM), for the code that must not report
anything else once it was.

The CLI's signal handler calls `note(signum)` and raises KeyboardInterrupt. An interrupt that
lands while an extension module initialises (numpy under onnxruntime, say) can surface as an
ImportError instead, or be turned into another error on its way up; `import_optional` and the
CLI's error handler consult `received()` so that such an error is reported as the interrupt it
is, never as "X is not installed".
"""

from __future__ import annotations

import importlib
from types import ModuleType

from llmir_core.errors import InputError

_received: int | None = None


def note(signum: int) -> None:
    """Record that signal `signum` asked the process to stop."""
    global _received
    _received = signum


def received() -> int | None:
    """The signal that asked the process to stop, or None."""
    return _received


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether `exc` came from an interrupt: one was received, or it is chained to one."""
    if _received is not None:
        return True
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def import_optional(name: str, message: str, hint: str) -> ModuleType:
    """Import an optional dependency. InputError(message, hint) only when it is not installed;
    KeyboardInterrupt when an interrupt broke the import; another InputError naming the cause
    when it is installed but cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if caused_by_interrupt(exc):
            raise KeyboardInterrupt from None
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing is not None and (name == missing or name.startswith(missing + ".")):
            raise InputError(message, hint=hint) from None
        raise InputError(
            f"{name} is installed but cannot be imported: {exc}", hint=f"reinstall it ({hint})"
        ) from None
