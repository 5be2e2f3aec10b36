"""SIGINT and SIGTERM: stop cleanly, exit 130 with `interrupted` on stderr and no traceback.

The handler records the signal (llmir_core.interrupts) and raises KeyboardInterrupt in the main
thread, so every `finally` and `except BaseException` cleanup runs (temp files and folders are
removed, nothing half-written stays). `announce()` prints the one `interrupted` line.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from llmir_core import interrupts
from llmir_core.errors import EXIT_INTERRUPTED

_announced = False


def _handler(signum: int, frame: FrameType | None) -> None:
    interrupts.note(signum)
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT and SIGTERM (main thread only; a no-op elsewhere)."""
    try:
        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)
    except ValueError:  # not the main thread (an embedding application)
        pass


def announce() -> int:
    """Print `interrupted` once; return the exit code for it."""
    global _announced
    if not _announced:
        _announced = True
        try:
            sys.stderr.write("interrupted\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    return EXIT_INTERRUPTED
