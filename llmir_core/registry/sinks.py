"""The two callbacks a pull reports through; the CLI implements them with rich on stderr."""

from __future__ import annotations

from typing import Protocol


class ProgressSink(Protocol):
    """Byte counts of each file's transfer (the CLI draws a progress bar from them)."""

    def start(self, name: str, total: int | None, initial: int) -> None: ...
    def advance(self, name: str, n: int) -> None: ...
    def finish(self, name: str) -> None: ...


class Reporter(Protocol):
    """Progress lines; `detail` is shown only with --verbose."""

    def log(self, message: str) -> None: ...
    def detail(self, message: str) -> None: ...


class Quiet:
    """A Reporter that says nothing."""

    def log(self, message: str) -> None:
        pass

    def detail(self, message: str) -> None:
        pass
