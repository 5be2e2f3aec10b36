"""Error values shared by every stage.

Exit codes (the CLI contract): 0 ok, 1 check failed, 2 usage or input error,
3 inconclusive, 130 interrupted.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import NamedTuple

EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3
EXIT_INTERRUPTED = 130

# errors of the machine, not of llmir (the disk is full or read-only, access is denied): exit 2
# with what to do about each
DISK_ERRNO_HINTS = {
    errno.ENOSPC: "free disk space, or write the output somewhere else",
    errno.EDQUOT: "free space within your disk quota, or write the output somewhere else",
    errno.EFBIG: "the file system cannot hold a file this large: write the output somewhere else",
    errno.EROFS: "the file system is read-only: write the output somewhere else",
    errno.EACCES: "check the permissions of the file and its folder",
    errno.EPERM: "check the permissions of the file and its folder",
    errno.EIO: "the disk reported an I/O error: check it, or use another one",
}


class SourcePos(NamedTuple):
    """A position in a text file: 1-based line and column.

    A NamedTuple rather than a frozen dataclass: the parser makes two per op, and a tuple is
    several times cheaper to create.
    """

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


SNIPPET_MAX = 400  # a source line longer than this is clipped under a diagnostic ...
SNIPPET_WIDTH = 160  # ... to this many characters around the column


def clip_line(
    line: str, col: int, width: int = SNIPPET_WIDTH, limit: int = SNIPPET_MAX
) -> tuple[str, int]:
    """The part of `line` shown under a diagnostic, and the caret's 0-based column in it: a line
    longer than `limit` (a 1 MB attribute) is cut to `width` characters around `col`, with '...'
    where cut."""
    at = max(col - 1, 0)
    if len(line) <= limit:
        return line, at
    start = max(0, min(at - width // 2, len(line) - width))
    shown = line[start : start + width]
    caret = at - start
    if start > 0:
        shown, caret = "..." + shown, caret + 3
    if start + width < len(line):
        shown += "..."
    return shown, caret


@dataclass
class Diagnostic:
    """One finding: severity, message, where, and optional notes."""

    severity: str  # "error" | "warning" | "note"
    message: str
    pos: SourcePos | None = None
    origin: str | None = None  # frontend origin (ONNX node, HF module, GGUF tensor)
    notes: list[str] = field(default_factory=list)
    source_line: str | None = None

    def header(self) -> str:
        where = f"{self.pos}: " if self.pos else ""
        origin = f" [{self.origin}]" if self.origin else ""
        return f"{where}{self.severity}: {self.message}{origin}"

    def render(self) -> str:
        """Render as text: header, the source line with a caret, then notes."""
        lines = [self.header()]
        if self.source_line is not None and self.pos is not None:
            shown, caret = clip_line(self.source_line.rstrip("\n"), self.pos.col)
            lines.append("  " + shown)
            lines.append("  " + " " * caret + "^")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "message": self.message,
            "file": self.pos.file if self.pos else None,
            "line": self.pos.line if self.pos else None,
            "col": self.pos.col if self.pos else None,
            "origin": self.origin,
            "notes": list(self.notes),
        }


class LlmirError(Exception):
    """An error a user can act on: one clear line, a hint, and an exit code."""

    exit_code = EXIT_USAGE

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        exit_code: int | None = None,
        diagnostics: list[Diagnostic] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.diagnostics = diagnostics or []
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(LlmirError):
    """Unreadable, malformed or inconsistent input (exit 2)."""


class ParseError(InputError):
    """A `.llmir` text that does not parse; carries its position."""

    def __init__(self, message: str, pos: SourcePos, source_line: str | None = None) -> None:
        diag = Diagnostic("error", message, pos, source_line=source_line)
        super().__init__(
            f"{pos}: error: {message}",
            diagnostics=[diag],
            hint="fix the text at the position shown, or run `llmir fmt` on a known-good file to compare",
        )
        self.pos = pos


class BuildError(InputError):
    """The module uses something the target cannot express or load (exit 2)."""


class CheckFailed(LlmirError):
    """A check ran and found a problem (exit 1)."""

    exit_code = 1
