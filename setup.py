"""The install step that builds llmir's onnxruntime custom-op library (everything else about the
package is in pyproject.toml).

Why setuptools and not scikit-build-core + CMake: the library is one compiler command over a
handful of C files (no configure step, no dependencies, the onnxruntime ABI is vendored in
ort_abi.h), and that same command is the compile-at-first-use fallback
(llmir_core/targets/onnxruntime/native/build.py). A build_ext step that runs it keeps one
definition of the build, adds no build dependency and no second build system, and works for
both `pip install -e .` (setuptools builds extensions in place for an editable install: the
library lands in the source tree's native/ folder, ignored by git) and a wheel (it lands in
build_lib, so the wheel ships it and is tagged for the platform).

Where there is no C compiler (or not Linux x86-64), the install still succeeds without the
library: artifacts built for cpu=x86-64 run, and ones built for llmir's kernels compile them at
first use once a compiler appears, or fail to open with one line that says so.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGE = "llmir_core.targets.onnxruntime.native"
NATIVE = Path(__file__).resolve().parent / Path(*PACKAGE.split("."))


def _native_build() -> ModuleType:
    """native/build.py, loaded by path: the build runs before llmir's dependencies exist."""
    spec = importlib.util.spec_from_file_location("_llmir_native_build", NATIVE / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildNative(build_ext):
    """Compile the custom-op library (not a Python extension) with native/build.py's command,
    into the package: in place for an editable install, else into build_lib."""

    def run(self) -> None:
        folder = NATIVE if self.inplace else Path(self.build_lib, *PACKAGE.split("."))
        if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
            self._skip(f"llmir's kernels are for Linux on x86-64 (this is {platform.machine()})")
            return
        nb = _native_build()
        folder.mkdir(parents=True, exist_ok=True)
        try:
            lib = nb.build_shipped(folder)
        except nb.CompileError as exc:
            self._skip(str(exc))
            return
        print(f"llmir: built {lib}", file=sys.stderr)

    def _skip(self, why: str) -> None:
        print(
            f"llmir: warning: the custom-op library was not built ({why}); artifacts that use "
            "llmir's kernels compile it at first use, or need --target-opt cpu=x86-64",
            file=sys.stderr,
        )

    def get_outputs(self) -> list[str]:
        folder = NATIVE if self.inplace else Path(self.build_lib, *PACKAGE.split("."))
        nb = _native_build()
        return [str(folder / name) for name in (nb.SHIPPED, nb.BUILD_RECORD)]


setup(
    # the library (listed as an extension so that build_ext runs and a wheel is platform-tagged;
    # BuildNative compiles it, the sources are native/*.c)
    ext_modules=[
        Extension(
            f"{PACKAGE}.libllmir_ops",
            sources=sorted(str(p.relative_to(NATIVE.parents[3])) for p in NATIVE.glob("*.c")),
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
