"""The `cpu` build option of the onnxruntime target: which machines an artifact is for, and so
whether the lowering may use llmir's kernels (domain `ai.llmir`). The lowering decides from this
option alone (the same `.llmir` and options give the same artifact on any machine); whether this
machine can run the artifact is checked when it opens (`check_can_run`).

- `x86-64-v3` (the default): llmir's kernels where they apply. They need AVX2, FMA and F16C
  (x86-64-v3 has them all).
- `x86-64`: onnxruntime's portable ops only; no `ai.llmir` op, no custom-op library to load.
- `host`: asked for by name only: probe this machine, x86-64-v3 when it can run llmir's kernels
  and has their library (shipped with the package, or compiled here), else x86-64.

Nothing here imports onnxruntime: its version comes from the package metadata.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

from llmir_core.errors import InputError

V3 = "x86-64-v3"
PORTABLE = "x86-64"
HOST = "host"
CPUS = (V3, PORTABLE, HOST)
CPU = V3  # the default
CPU_FLAGS = ("avx2", "fma", "f16c")  # what llmir's kernels are compiled for (build.FLAGS)
MIN_ORT = (1, 17)  # the custom-op struct and OrtApi version the library asks for
DISABLE_ENV = "LLMIR_NO_CUSTOM_OPS"  # 1: never load the library (an artifact needing it fails)
CPUINFO = "/proc/cpuinfo"


def check_cpu(cpu: str) -> None:
    if cpu not in CPUS:
        raise InputError(
            f"unknown cpu '{cpu}'",
            hint=f"use one of: {', '.join(CPUS)} ({V3}: llmir's kernels, the default; "
            f"{PORTABLE}: onnxruntime's portable ops only; {HOST}: probe this machine)",
        )


def llmir_kernels(cpu: str) -> bool:
    """Whether a lowering for cpu may use llmir's kernels (cpu is resolved: not `host`)."""
    check_cpu(cpu)
    if cpu == HOST:
        raise ValueError("cpu=host is resolved before the passes run (resolve_cpu)")
    return cpu == V3


def no_kernels(option: str, cpu: str) -> InputError:
    """The error for an option (`name=value`) that asks for llmir's kernel by name in a build
    for a cpu without them."""
    return InputError(
        f"{option} needs llmir's kernels, and cpu={cpu} allows onnxruntime's portable ops only",
        hint=f"drop {option.split('=')[0]} (auto picks onnxruntime's op) or build with cpu={V3}",
    )


def cpu_flags(path: str = CPUINFO) -> set[str]:
    """The feature flags /proc/cpuinfo lists (empty where it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
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


def machine_problem() -> str | None:
    """Why this machine cannot run llmir's kernels (platform, CPU flags, onnxruntime version),
    or None when it can."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"it needs Linux on x86-64 (this is {platform.system()} {platform.machine()})"
    missing = [f for f in CPU_FLAGS if f not in cpu_flags()]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    ver = _ort_version()
    if ver is None or _version_tuple(ver) < MIN_ORT:
        return f"it needs onnxruntime >= {'.'.join(map(str, MIN_ORT))} (found {ver})"
    return None


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_can_run() -> None:
    """Raise the one-line error (exit 2) when this machine cannot run an artifact built for
    cpu=x86-64-v3: called when such an artifact opens, before its library loads."""
    why = f"{DISABLE_ENV} is set" if disabled() else machine_problem()
    if why is not None:
        from llmir_core.targets.onnxruntime.native import CustomOpError

        raise CustomOpError(
            f"this artifact was built for cpu={V3} (llmir kernels: AVX2, FMA, F16C); {why}: "
            f"rebuild with --target-opt cpu={PORTABLE}"
        )


def resolve_cpu(cpu: str) -> str:
    """cpu, with `host` replaced by what this machine runs: x86-64-v3 when it can run llmir's
    kernels and their library is shipped or compiles here, else x86-64. Only `host` probes."""
    check_cpu(cpu)
    if cpu != HOST:
        return cpu
    if disabled() or machine_problem() is not None:
        return PORTABLE
    from llmir_core.targets.onnxruntime.native import CustomOpError, library_path

    try:
        library_path()
    except CustomOpError:
        return PORTABLE
    return V3


__all__ = [
    "CPU",
    "CPUS",
    "CPU_FLAGS",
    "DISABLE_ENV",
    "HOST",
    "PORTABLE",
    "V3",
    "check_can_run",
    "check_cpu",
    "llmir_kernels",
    "machine_problem",
    "no_kernels",
    "resolve_cpu",
]
