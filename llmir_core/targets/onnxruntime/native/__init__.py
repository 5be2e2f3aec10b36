"""llmir's onnxruntime custom-op library (domain `ai.llmir`): matmul kernels that read weights
in their stored format (`ort.matmul16`: f32 x 16-bit weights; `ort.matmul_nbits` with
`kernel = "llmir"`: f32 x 4/8-bit blocks, matmul_nbits.c; `ort.matmul_gguf`: f32 x GGUF blocks
as stored in the file, matmul_gguf.c, which also exports `llmir_gguf_dequant`), attention and norms.

The C sources next to this file (register.c holds the entry point, each other *.c one op family,
ort_abi.h the onnxruntime ABI, f32_gemm.h shared kernels) are compiled into one shared library
for AVX2 + FMA + F16C (the `cpu = "x86-64-v3"` build option, native/cpu.py) by one compiler
command (native/build.py, `$CC` else `cc`):

- when the package is installed (setup.py's build_ext step): `libllmir_ops.so` and its record
  `_build.json` (its sha256 and the digest of the sources it came from) in this folder, for an
  editable install too (an ignored file in the source tree). Where the install had no compiler
  the library is absent;
- otherwise (a source tree never installed, sources changed since the install, or an install
  without a compiler), on first use: cached under `$LLMIR_HOME/ort_ext/` (LLMIR_HOME defaults to
  `$XDG_CACHE_HOME/llmir`; `$LLMIR_EXT_CACHE` overrides the folder), keyed by the sources and the
  flags, with `<library>.sha256` next to it (the sha256 of the bytes it was built as).

Every library is hash-checked before onnxruntime loads it (its registration code never runs from
a file llmir did not write): the shipped one against the record the install wrote inside the
package (a mismatch is an error, never a load), a cached one against its record (a mismatch is
rebuilt, or an error where it cannot be). Loading needs no compiler when a verified library is
there. `library_path(sanitized=True)` builds the same sources with AddressSanitizer and UBSan into
`<cache>/asan/` (for scripts/fuzz_kernels.py --asan; loading it needs libasan preloaded).

The lowering never asks this machine anything (the `cpu` option decides); `register` (called when
an artifact whose manifest names the library opens) checks that this machine can run it
(cpu.check_can_run: one clear line, exit 2) and loads it. `LLMIR_NO_CUSTOM_OPS=1` changes no
build: it only forbids loading the library, so an artifact that needs it fails to open.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmir_core.errors import InputError
from llmir_core.targets.onnxruntime.native import build as _b
from llmir_core.targets.onnxruntime.native.cpu import (
    CPU_FLAGS,
    DISABLE_ENV,
    MIN_ORT,
    check_can_run,
    disabled,
    machine_problem,
)

LIBRARY = _b.LIBRARY  # the name a manifest records (`custom_ops`)
ALIASES = ("matmul16",)  # names older manifests recorded for the same library
DOMAIN = "ai.llmir"
OP_NAMES = {"f16": "MatMulF16", "bf16": "MatMulBf16", "f32": "MatMulF32"}
NBITS_OP_NAMES = {4: "MatMulNBitsQ4", 8: "MatMulNBitsQ8"}  # ort.matmul_nbits {kernel = "llmir"}
GGUF_OP_NAME = "MatMulGGUF"  # ort.matmul_gguf: X f32 [..., K], W uint8 [N, row_bytes], `format`
# MatMulGGUF and llmir_gguf_dequant take the formats of llmir_core.quant.gguf_blocks.BLOCKS
HERE = Path(__file__).parent
SOURCES = _b.SOURCES
HEADERS = _b.HEADERS
FLAGS = _b.FLAGS
SANITIZE_FLAGS = _b.SANITIZE_FLAGS
SHIPPED_DIR = HERE  # where an install puts the library and its record (tests point it elsewhere)
DIGEST_SUFFIX = ".sha256"  # the record of a cached library's digest, next to it
CACHE_ENV = "LLMIR_EXT_CACHE"  # where compiled libraries go (default $LLMIR_HOME/ort_ext)


class CustomOpError(InputError):
    """The custom-op library an artifact needs cannot be built or loaded here (exit 2)."""


def unavailable_reason() -> str | None:
    """Why llmir's kernels cannot run on this machine (LLMIR_NO_CUSTOM_OPS, the platform, the
    CPU, onnxruntime, or neither a shipped library nor a compiler), or None when they can. It
    compiles nothing (the kernel tests skip on it; no lowering asks it)."""
    if disabled():
        return f"{DISABLE_ENV} is set"
    why = machine_problem()
    if why is not None:
        return why
    if _b.compiler() is None and _shipped_or_none() is None and not verified(_cache_path(FLAGS)):
        return f"no library shipped with the package and no C compiler ({_cc_name()}) on PATH"
    return None


def _cc_name() -> str:
    return os.environ.get("CC") or "cc"


def _shipped_or_none() -> Path | None:
    try:
        return shipped_library()
    except CustomOpError:
        return None


def shipped_library() -> Path | None:
    """The library the install built into the package, once its bytes match the sha256 the
    install recorded; None when there is none (no record: an install without a compiler, or a
    source tree) or its sources changed since (an editable install edited: compiled at first
    use instead). A library that does not match its record is an error, never a load."""
    record = _b.read_record(SHIPPED_DIR)
    if record is None or record["sources"] != _b.source_digest():
        return None
    lib = SHIPPED_DIR / record["library"]
    if not lib.is_file():
        return None
    if _b.sha256_file(lib) != record["sha256"]:
        raise CustomOpError(
            f"the {LIBRARY} library at {lib} does not match the sha256 recorded when the "
            "package was built: reinstall llmir"
        )
    return lib


def _cache_dir() -> Path:
    """$LLMIR_EXT_CACHE (the tests share one across their per-test LLMIR_HOMEs), else
    $LLMIR_HOME/ort_ext."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    from llmir_core.artifact_check import _llmir_home

    return Path(_llmir_home()) / "ort_ext"


def library_path(sanitized: bool = False) -> str:
    """The library: the one shipped in the package when it is there (and verified), else the
    one compiled on first use (cached by sources and flags, and handed out only while its
    bytes match the digest recorded when it was built); sanitized: the AddressSanitizer +
    UBSan build, in its own cache folder."""
    if not sanitized:
        shipped = shipped_library()
        if shipped is not None:
            return str(shipped)
    flags = SANITIZE_FLAGS if sanitized else FLAGS
    return _built(_cache_path(flags), flags)


def _cache_path(flags: Sequence[str]) -> Path:
    """Where the library compiled with flags is cached (named by its sources and flags)."""
    folder = _cache_dir() / "asan" if flags == SANITIZE_FLAGS else _cache_dir()
    return folder / f"lib{LIBRARY}-{_b.source_digest(flags)[:16]}.so"


def _sha256(path: Path) -> str:
    return _b.sha256_file(path)


def digest_record(path: Path) -> Path:
    """Where the digest of the cached library at `path` is recorded (written when it is built)."""
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
    try:
        digest = _b.compile_to(out, flags)
    except _b.CompileError as exc:
        raise CustomOpError(
            f"the artifact needs llmir's onnxruntime custom ops ({LIBRARY}): no library was "
            f"shipped with the package, and {exc}",
            hint="install llmir where a C compiler exists (the install builds the library), or "
            "rebuild the artifact with --target-opt cpu=x86-64",
        ) from None
    _write_record(out, f"{digest}  {out.name}\n")


def _write_record(out: Path, record: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", suffix=DIGEST_SUFFIX, dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(record)
        os.replace(tmp, digest_record(out))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


ISA_ENV = "LLMIR_KERNEL_ISA"  # auto (default) | avx2 (force the fallback) | avx512 (isa.h)
ISAS = ("auto", "avx2", "avx512")


def check_isa_env() -> None:
    """LLMIR_KERNEL_ISA is a known choice, and `avx512` only on a CPU that has it (isa.h: the
    library checks the same when it registers; this gives the one-line error first)."""
    want = os.environ.get(ISA_ENV) or "auto"
    if want not in ISAS:
        raise CustomOpError(f"{ISA_ENV}={want}: expected one of {', '.join(ISAS)}")
    if want == "avx512":
        missing = missing_avx512()
        if missing:
            raise CustomOpError(
                f"{ISA_ENV}=avx512, and this CPU lacks {', '.join(missing)}",
                hint=f"unset {ISA_ENV} (auto picks the AVX2 kernels here)",
            )


AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")  # /proc/cpuinfo


def missing_avx512() -> list[str]:
    """The AVX-512 features the kernels' AVX-512 variant needs that this CPU lacks ([]: it can
    run it; isa.h asks the CPU the same)."""
    from llmir_core.targets.onnxruntime.native import cpu

    flags = cpu.cpu_flags()
    return [f for f in AVX512_FLAGS if f not in flags]


def kernel_variants() -> dict[str, str]:
    """The instruction-set variant each llmir op runs with in this process ({op name: "avx2" |
    "avx512-vnni"}): what the library's `llmir_kernel_variants` says under LLMIR_KERNEL_ISA and
    this CPU (the choice `register` made, the same rule). Loads the library (verified) if
    needed; {} where the kernels cannot run here."""
    import ctypes

    if unavailable_reason() is not None:
        return {}
    try:
        check_isa_env()
        lib = ctypes.CDLL(library_path())
    except (InputError, OSError):
        return {}
    lib.llmir_isa_select.restype = ctypes.c_char_p
    lib.llmir_kernel_variants.restype = ctypes.c_char_p
    lib.llmir_isa_select()
    text = lib.llmir_kernel_variants().decode("ascii")
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def register(so: Any, names: Sequence[str]) -> None:
    """Register the custom-op libraries a manifest's `custom_ops` names on SessionOptions so,
    once this machine can run them (cpu.check_can_run: the one-line error otherwise)."""
    done = False
    for name in names:
        if name != LIBRARY and name not in ALIASES:
            raise CustomOpError(
                f"the artifact needs an unknown custom-op library '{name}'",
                hint="it was built by a newer llmir: rebuild it with this one",
            )
        if not done:
            check_can_run()
            check_isa_env()
            so.register_custom_ops_library(library_path())
            done = True


__all__ = [
    "ALIASES",
    "CPU_FLAGS",
    "DISABLE_ENV",
    "DOMAIN",
    "GGUF_OP_NAME",
    "ISA_ENV",
    "LIBRARY",
    "MIN_ORT",
    "NBITS_OP_NAMES",
    "OP_NAMES",
    "CustomOpError",
    "check_isa_env",
    "kernel_variants",
    "library_path",
    "missing_avx512",
    "register",
    "shipped_library",
    "unavailable_reason",
]
