"""A full or read-only disk, simulated in this process for the files under one folder.

`DiskFault(root, errno.ENOSPC, at=n)` makes the n-th write under `root` and every later one fail
as a full disk does (OSError ENOSPC from a write call, with no file name); `DiskFault(root,
errno.EROFS, at=n)` makes the n-th file or folder created under `root` and every later one fail
as a read-only file system does (EROFS from open or mkdir, naming the path); `DiskFault(root,
SIGINT, at=n)` raises KeyboardInterrupt once at the n-th write, as llmir's SIGINT handler
(llmir_cli/_signals.py) does when Ctrl-C lands mid-write. With `at=0` nothing fails and the events are only counted,
so a caller can place a fault at every eighth of a command's writes.

It patches Python's file-opening and writing functions (builtins.open / io.open, which
os.fdopen and pathlib use too; os.open, os.mkdir, os.write, os.pwrite, os.sendfile, which
shutil.copyfile uses, os.copy_file_range):
no root, no tmpfs, no LD_PRELOAD, so it runs the same on a CI machine. Writes that bypass them
(a C library writing on its own) are not seen; llmir writes every output file from Python.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SIGINT = 0  # not an errno: the interrupt fault
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class DiskFault:
    def __init__(self, root: Path, code: int, at: int = 0) -> None:
        assert code in (errno.ENOSPC, errno.EROFS, SIGINT)
        self.root = os.path.realpath(root) + os.sep
        self.code, self.at = code, at
        self.writes = 0  # write calls under root
        self.creates = 0  # files and folders created (opened for writing) under root
        self.fired = False

    def _under(self, path: Any) -> bool:
        if isinstance(path, int):
            try:
                path = os.readlink(f"/proc/self/fd/{path}")
            except OSError:
                return False
        try:
            p = os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path)))
        except (TypeError, ValueError):
            return False
        return (p + os.sep).startswith(self.root)

    def created(self, path: Any) -> None:
        if not self._under(path):
            return
        self.creates += 1
        if self.code == errno.EROFS and self.at and self.creates >= self.at:
            self.fired = True
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    def wrote(self, fd_or_path: Any) -> None:
        if not self._under(fd_or_path):
            return
        self.writes += 1
        if self.code == errno.ENOSPC and self.at and self.writes >= self.at:
            self.fired = True
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.code == SIGINT and self.writes == self.at:
            from llmir_core import interrupts

            self.fired = True
            interrupts.note(signal.SIGINT)
            raise KeyboardInterrupt

    @property
    def events(self) -> int:
        return self.creates if self.code == errno.EROFS else self.writes


class _Faulty:
    """A file object opened for writing under the faulty folder: every write is an event."""

    def __init__(self, fh: Any, fault: DiskFault, path: Any) -> None:
        self._fh, self._fault, self._path = fh, fault, path

    def write(self, data: Any) -> Any:
        self._fault.wrote(self._path)
        return self._fh.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __enter__(self) -> _Faulty:
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._fh.__exit__(*exc)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._fh)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


@contextmanager
def disk_fault(root: Path, code: int, at: int = 0) -> Iterator[DiskFault]:
    """Install a DiskFault for the duration of the block (see the module's docstring)."""
    fault = DiskFault(root, code, at)
    real_open, real_os_open, real_mkdir = io.open, os.open, os.mkdir
    real_write, real_pwrite, real_sendfile = os.write, os.pwrite, os.sendfile
    real_cfr = getattr(os, "copy_file_range", None)

    def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        writing = any(c in mode for c in "wax+")
        if writing and not isinstance(file, int):
            fault.created(file)
        fh = real_open(file, mode, *args, **kwargs)
        if writing and fault._under(file):
            return _Faulty(fh, fault, file)
        return fh

    def fake_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & _WRITE_FLAGS:
            fault.created(path)
        return real_os_open(path, flags, *args, **kwargs)

    def fake_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        fault.created(path)
        real_mkdir(path, *args, **kwargs)

    def fake_write(fd: int, data: Any) -> int:
        if fd > 2:
            fault.wrote(fd)
        return real_write(fd, data)

    def fake_pwrite(fd: int, data: Any, offset: int) -> int:
        fault.wrote(fd)
        return real_pwrite(fd, data, offset)

    def fake_sendfile(dst: int, src: int, offset: Any, count: int) -> int:  # shutil.copyfile
        fault.wrote(dst)
        return real_sendfile(dst, src, offset, count)

    def fake_cfr(src: int, dst: int, count: int, *args: Any, **kwargs: Any) -> int:
        fault.wrote(dst)
        assert real_cfr is not None
        return real_cfr(src, dst, count, *args, **kwargs)

    patches: list[tuple[Any, str, Any]] = [
        (builtins, "open", fake_open),
        (io, "open", fake_open),
        (os, "open", fake_os_open),
        (os, "mkdir", fake_mkdir),
        (os, "write", fake_write),
        (os, "pwrite", fake_pwrite),
        (os, "sendfile", fake_sendfile),
    ]
    if real_cfr is not None:
        patches.append((os, "copy_file_range", fake_cfr))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    from llmir_core import interrupts

    received = interrupts._received
    try:
        for obj, name, new in patches:
            setattr(obj, name, new)
        yield fault
    finally:
        for obj, name, old in saved:
            setattr(obj, name, old)
        interrupts._received = received  # the process goes on: forget a simulated interrupt


def eighths(n: int) -> list[int]:
    """The event numbers at every eighth of `n` events (1-based, each once)."""
    return sorted({max(1, -(-n * k // 8)) for k in range(1, 9)}) if n else []
