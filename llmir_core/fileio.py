"""Atomic file writing: write to a temp file beside the target, then rename."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import DISK_ERRNO_HINTS, InputError


@contextlib.contextmanager
def writing_output(path: str | os.PathLike[str], what: str = "output") -> Iterator[None]:
    """A full, read-only or forbidden disk while the block writes `path` is one InputError
    naming `path` (the OSError of a failed write names no file); other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in DISK_ERRNO_HINTS:
            raise
        raise InputError(
            f"{path}: cannot write the {what}: {exc.strerror}",
            hint=DISK_ERRNO_HINTS[exc.errno] + "; nothing was written",
        ) from None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:  # type: ignore[type-arg]
    """Yield a file handle; the target appears only if the block finishes without error. A
    symbolic link is written through (the file it points to is replaced, the link stays)."""
    target = Path(path)
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    if target.is_dir():
        raise InputError(f"{path}: is a folder, expected a file path")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(
            f"{target}: folder {parent} does not exist",
            hint="create the folder first or pick another output path",
        )
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
        # mkstemp creates 0600 files; give the result the mode a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
    except OSError as exc:
        raise InputError(
            f"{target}: cannot write in {parent}: {exc.strerror}",
            hint="check the folder's permissions and free space",
        ) from exc
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InputError(
            f"{target}: write failed: {exc.strerror}", hint="check free disk space and permissions"
        ) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class NewFiles:
    """Paths a command may create besides its output (that did not exist when it started):
    `remove()` deletes those that were created, for a run whose output was not written."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def remove(self) -> None:
        for p in self.paths:
            with contextlib.suppress(OSError):
                os.unlink(p)

    @contextlib.contextmanager
    def removed_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.remove()
            raise


def new_files(paths: list[str]) -> NewFiles:
    """The paths among `paths` (empty strings skipped) that do not exist yet."""
    return NewFiles([p for p in dict.fromkeys(paths) if p and not os.path.lexists(p)])


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, read in chunks (never the whole file at once)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def replace_dir(tmp: str, out_dir: str, guard: Callable[[str], None] | None = None) -> None:
    """Move a finished temp folder into place; the old folder goes only once the new one is in.
    `guard(out_dir)` runs right before the swap and raises to refuse it (a folder that became
    something llmir must not delete while the new one was being written)."""
    if guard is not None:
        guard(out_dir)
    if not os.path.exists(out_dir) and not os.path.islink(out_dir):
        os.rename(tmp, out_dir)
        return
    old = out_dir + ".old-" + os.path.basename(tmp)
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def read_json(path: str | os.PathLike[str], *, hint: str | None = None) -> Any:
    """A JSON file's value; bytes that are not UTF-8, a syntax error or nesting too deep for
    Python is an InputError at `file:line:col` (with `hint`)."""
    try:
        text = read_text(path)
    except InputError as exc:
        raise InputError(exc.message, hint=hint or exc.hint) from None
    if not text.strip():
        raise InputError(f"{path}: empty file, expected JSON", hint=hint)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})", hint=hint
        ) from None
    except RecursionError:
        raise InputError(f"{path}: not valid JSON (nested too deeply)", hint=hint) from None
    reject_surrogates(value, text, path, hint)
    return value


def reject_surrogates(
    value: Any, text: str, path: str | os.PathLike[str], hint: str | None = None
) -> None:
    """A JSON value decoded from `text` must be text all through: a lone surrogate escape such as
    "\\ud800" decodes to a string no file can hold, so refuse it where it is written."""
    if "\\u" not in text:
        return
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        m = re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", text)
        at = m.start() if m else 0
        line, col = text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
        raise InputError(
            f"{path}:{line}:{col}: a lone UTF-16 surrogate escape, which is not text", hint=hint
        ) from None


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file; a byte that is not UTF-8 is an InputError at `file:line:col`."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected a text file") from None
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = (
            len(data[data.rfind(b"\n", 0, exc.start) + 1 : exc.start].decode("utf-8", "replace"))
            + 1
        )
        raise InputError(
            f"{path}:{line}:{col}: not UTF-8 text (byte {data[exc.start]:#04x})",
            hint="save the file as UTF-8",
        ) from None


def read_text_lines(path: str | os.PathLike[str]) -> list[str]:
    """A UTF-8 text file's lines (see read_text)."""
    return read_text(path).splitlines()
