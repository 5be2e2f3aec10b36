"""llmir's onnxruntime custom-op library (domain `ai.llmir`): matmul kernels that read weights
in their stored format (`ort.matmul16`: f32 x 16-bit weights; `ort.matmul_nbits` with
`kernel = "llmir"`: f32 x 4/8-bit blocks, matmul_nbits.c; `ort.matmul_gguf`: f32 x GGUF blocks
as stored in the file, matmul_gguf.c, which also exports `llmir_gguf_dequant`).

The C sources next to this file (register.c holds the entry point, each other *.c one op family,
ort_abi.h the onnxruntime ABI, f32_gemm.h shared kernels) are compiled into one shared library on
first use with the system C compiler (`$CC`, else `cc`) for AVX2 + FMA + F16C, and cached under
`$LLMIR_HOME/ort_ext/` (LLMIR_HOME defaults to `$XDG_CACHE_HOME/llmir`; `$LLMIR_EXT_CACHE`
overrides the folder), keyed by the source, the flags and the
onnxruntime version; the shared object is written to a temp file and renamed into place, so
concurrent first uses never see a partial library. Next to it goes `<library>.sha256`, the
sha256 of the bytes it was built as: a cached library is handed to onnxruntime only when its
digest matches that record (checked on every `library_path()` call, before onnxruntime loads
it, so its registration code never runs from a file llmir did not write); a library that does
not match, or has no record, is rebuilt, and when it cannot be rebuilt the error says so.
`library_path(sanitized=True)` builds the same sources with AddressSanitizer and UBSan into
`<cache>/asan/` (for scripts/fuzz_kernels.py --asan; loading it needs libasan preloaded).

`capability()` says whether this machine can use it (the lowering asks, and records the answer
as the op it emits: `ort.matmul16` or the f32 path); `library_path()` returns the compiled
library (compiling it when needed) for `SessionOptions.register_custom_ops_library`. Nothing
here imports onnxruntime: its version comes from the package metadata.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from llmir_core.errors import InputError

LIBRARY = "llmir_ops"  # the name a manifest records (`custom_ops`)
ALIASES = ("matmul16",)  # names older manifests recorded for the same library
DOMAIN = "ai.llmir"
OP_NAMES = {"f16": "MatMulF16", "bf16": "MatMulBf16", "f32": "MatMulF32"}
NBITS_OP_NAMES = {4: "MatMulNBitsQ4", 8: "MatMulNBitsQ8"}  # ort.matmul_nbits {kernel = "llmir"}
GGUF_OP_NAME = "MatMulGGUF"  # ort.matmul_gguf: X f32 [..., K], W uint8 [N, row_bytes], `format`
# MatMulGGUF and llmir_gguf_dequant take the formats of llmir_core.quant.gguf_blocks.BLOCKS
HERE = Path(__file__).parent
# compiled together: register.c and one file per op family
SOURCES = tuple(sorted(HERE.glob("*.c")))
HEADERS = tuple(sorted(HERE.glob("*.h")))
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC")
CPU_FLAGS = ("avx2", "fma", "f16c")
MIN_ORT = (1, 17)  # the custom-op struct and OrtApi version the library asks for
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
DIGEST_SUFFIX = ".sha256"  # the record of a built library's digest, next to it
DISABLE_ENV = "LLMIR_NO_CUSTOM_OPS"  # set to 1: the capability is absent (the f32 path)
CACHE_ENV = "LLMIR_EXT_CACHE"  # where compiled libraries go (default $LLMIR_HOME/ort_ext)


class CustomOpError(InputError):
    """The custom-op library an artifact needs cannot be built or loaded here (exit 2)."""


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _ort_version() -> str | None:
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        return None


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def unavailable_reason() -> str | None:
    """Why the library cannot be used on this machine, or None when it can."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return f"{DISABLE_ENV} is set"
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs Linux on x86-64 (this is {platform.system()} {platform.machine()})"
    missing = [f for f in CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    ver = _ort_version()
    if ver is None or _version_tuple(ver) < MIN_ORT:
        return f"needs onnxruntime >= {'.'.join(map(str, MIN_ORT))} (found {ver})"
    if _compiler() is None:
        return f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH"
    return None


def capability() -> bool:
    return unavailable_reason() is None


def build_problem() -> str | None:
    """Why llmir's ops cannot run on this machine (unavailable_reason, or the library failing to
    compile: it is compiled once and cached), or None: what a lowering asks before it records
    `kernel = "llmir"` for the machine it runs on."""
    why = unavailable_reason()
    if why is None:
        try:
            library_path()
        except CustomOpError as exc:
            why = exc.message
    return why


def _cache_dir() -> Path:
    """$LLMIR_EXT_CACHE (the tests share one across their per-test LLMIR_HOMEs), else
    $LLMIR_HOME/ort_ext."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    from llmir_core.artifact_check import _llmir_home

    return Path(_llmir_home()) / "ort_ext"


def _key(flags: Sequence[str] = FLAGS) -> str:
    h = hashlib.sha256()
    for src in (*SOURCES, *HEADERS):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update(" ".join(flags).encode())
    h.update((_ort_version() or "").encode())
    return h.hexdigest()[:16]


def library_path(sanitized: bool = False) -> str:
    """The compiled library (built on first use; cached by source, flags and onnxruntime, and
    handed out only while its bytes match the digest recorded when it was built); sanitized: the
    AddressSanitizer + UBSan build, in its own folder."""
    why = unavailable_reason()
    if why is not None:
        raise CustomOpError(
            f"the artifact needs llmir's onnxruntime custom ops ({LIBRARY}), unavailable here: "
            f"{why}",
            hint="rebuild the artifact on this machine (`llmir build`): without the custom ops "
            "the build takes the f32 path",
        )
    flags = SANITIZE_FLAGS if sanitized else FLAGS
    folder = _cache_dir() / "asan" if sanitized else _cache_dir()
    return _built(folder / f"lib{LIBRARY}-{_key(flags)}.so", flags)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_record(path: Path) -> Path:
    """Where the digest of the library at `path` is recorded (written when it is built)."""
    return path.with_name(path.name + DIGEST_SUFFIX)


def verified(path: Path) -> bool:
    """The library at `path` exists and its sha256 is the one recorded when it was built."""
    try:
        want = digest_record(path).read_text(encoding="ascii").split()[0]
        return _sha256(path) == want
    except (OSError, UnicodeDecodeError, IndexError):
        return False


def _built(out: Path, flags: Sequence[str]) -> str:
    """out, verified against its digest record; built (again) when missing or not matching."""
    for _ in range(2):  # a second try: a concurrent build may land between ours and its record
        if verified(out):
            return str(out)
        _build(out, flags)
    if not verified(out):  # the folder is not ours alone
        raise CustomOpError(
            f"the {LIBRARY} library at {out} does not match the digest recorded when it was built",
            hint=f"remove {out.parent} (or point ${CACHE_ENV} at a folder only you can write)",
        )
    return str(out)


def _build(out: Path, flags: Sequence[str]) -> None:
    """Compile the sources into out, then record its digest (both written by rename)."""
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    cc = _compiler()
    assert cc is not None
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
            raise CustomOpError(f"compiling {LIBRARY} with {cc} failed: {exc}") from None
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
            raise CustomOpError(f"compiling {LIBRARY} with {cc} failed: {first}")
        record = f"{_sha256(Path(tmp))}  {out.name}\n"
        os.replace(tmp, out)
        _write_record(out, record)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_record(out: Path, record: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", suffix=DIGEST_SUFFIX, dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(record)
        os.replace(tmp, digest_record(out))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def register(so: Any, names: Sequence[str]) -> None:
    """Register the custom-op libraries a manifest's `custom_ops` names on SessionOptions so."""
    done = False
    for name in names:
        if name != LIBRARY and name not in ALIASES:
            raise CustomOpError(
                f"the artifact needs an unknown custom-op library '{name}'",
                hint="it was built by a newer llmir: rebuild it with this one",
            )
        if not done:
            so.register_custom_ops_library(library_path())
            done = True


__all__ = [
    "ALIASES",
    "DOMAIN",
    "GGUF_OP_NAME",
    "LIBRARY",
    "NBITS_OP_NAMES",
    "OP_NAMES",
    "CustomOpError",
    "capability",
    "library_path",
    "register",
    "unavailable_reason",
]
