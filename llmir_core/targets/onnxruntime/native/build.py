"""How llmir's custom-op library is compiled and recorded: one compiler command, used both when
the package is installed (setup.py loads this file by path: the standard library only, no
llmir import, since the build runs before llmir's dependencies are installed) and at first use
in a source tree (`native.library_path`, the fallback).

An installed build writes `libllmir_ops.so` and `BUILD_RECORD` (JSON: the library's file name,
its sha256, and the digest of the sources and flags it was compiled from) into the package's
native/ folder; `native.library_path` loads the library only while its bytes match that record
and the record's source digest matches the sources beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

LIBRARY = "llmir_ops"  # the name a manifest records (`custom_ops`)
HERE = Path(__file__).parent
# compiled together: register.c and one file per op family
SOURCES = tuple(sorted(HERE.glob("*.c")))
HEADERS = tuple(sorted(HERE.glob("*.h")))
# x86-64-v3's kernels: AVX2 + FMA + F16C (the `cpu` build option, native/cpu.py)
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC")
# AddressSanitizer + UBSan (reports, no abort: the fuzz harness reads them from stderr); alignment
# is left out: the kernels load 8-byte pairs of floats from 4-byte-aligned addresses on purpose
SANITIZE_FLAGS = (
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize=alignment",
    "-mavx2",
    "-mfma",
    "-mf16c",
    "-shared",
    "-fPIC",
)
SHIPPED = f"lib{LIBRARY}.so"  # the library an install builds, in this folder
BUILD_RECORD = "_build.json"  # its record, written by the same build


class CompileError(Exception):
    """The library did not compile; the message is one line."""


def compiler() -> str | None:
    """The C compiler on PATH (`$CC`, else `cc`), or None."""
    return shutil.which(os.environ.get("CC") or "cc")


def source_digest(flags: Sequence[str] = FLAGS) -> str:
    """sha256 over the sources, the headers and the flags: what a library was compiled from."""
    h = hashlib.sha256()
    for src in (*SOURCES, *HEADERS):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update(" ".join(flags).encode())
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compile_to(out: Path, flags: Sequence[str] = FLAGS) -> str:
    """Compile the sources into out (written to a temp file and renamed into place, so a
    concurrent reader never sees a partial library); the sha256 of the bytes written."""
    cc = compiler()
    if cc is None:
        raise CompileError(f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH")
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".lib{LIBRARY}-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        try:
            proc = subprocess.run(
                [cc, *flags, "-o", tmp, *map(str, SOURCES)],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompileError(f"compiling {LIBRARY} with {cc} failed: {exc}") from None
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
            raise CompileError(f"compiling {LIBRARY} with {cc} failed: {first}")
        digest = sha256_file(Path(tmp))
        os.replace(tmp, out)
        return digest
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_shipped(folder: Path) -> Path:
    """The install step: compile SHIPPED into folder and write BUILD_RECORD beside it (the
    record last, so a library without a record is never taken for a finished build)."""
    (folder / BUILD_RECORD).unlink(missing_ok=True)
    (folder / SHIPPED).unlink(missing_ok=True)  # no stale library stays when this build fails
    digest = compile_to(folder / SHIPPED)
    (folder / SHIPPED).chmod(0o755)  # an installed package is read by every user
    write_record(folder, digest)
    return folder / SHIPPED


def write_record(folder: Path, digest: str) -> None:
    """BUILD_RECORD for the library SHIPPED in folder, whose sha256 is digest."""
    record = folder / BUILD_RECORD
    body = {"library": SHIPPED, "sha256": digest, "sources": source_digest()}
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n", encoding="ascii")
    os.replace(tmp, record)


def read_record(folder: Path) -> dict[str, str] | None:
    """folder's BUILD_RECORD, or None when it has none (or an unreadable one)."""
    try:
        body = json.loads((folder / BUILD_RECORD).read_text(encoding="ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or not all(
        isinstance(body.get(k), str) for k in ("library", "sha256", "sources")
    ):
        return None
    return {k: str(body[k]) for k in ("library", "sha256", "sources")}


__all__ = [
    "BUILD_RECORD",
    "FLAGS",
    "LIBRARY",
    "SANITIZE_FLAGS",
    "SHIPPED",
    "SOURCES",
    "CompileError",
    "build_shipped",
    "compile_to",
    "compiler",
    "read_record",
    "sha256_file",
    "source_digest",
    "write_record",
]
