"""The custom-op library is loaded only when its sha256 matches the record written when it was
built (llmir_core/targets/onnxruntime/native/__init__.py): the library an install built into the
package (native/build.py, run by setup.py) against the install's record inside the package (a
tampered one is refused, never loaded); a cached one (compiled at first use in a source tree)
against the record next to it (rebuilt, or refused when it cannot be). Neither needs a compiler
to load: a verified library is used as it is."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from llmir_core.targets.onnxruntime import native as ort_ext
from llmir_core.targets.onnxruntime.native import (
    CustomOpError,
    digest_record,
    library_path,
    verified,
)
from llmir_core.targets.onnxruntime.native import build as native_build

WHY = ort_ext.unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"llmir's custom ops cannot run: {WHY}")

EVIL = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) fputs("loaded", f), fclose(f);
}
void *RegisterCustomOps(void *options, void *base) { (void)options, (void)base; return 0; }
"""


def _no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `cc` on PATH (nor $CC), and any compile attempt fails the test."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)

    def refuse(*args: object, **kw: object) -> str:
        raise AssertionError("compiled")

    monkeypatch.setattr(native_build, "compile_to", refuse)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A private cache holding a copy of the built library and its record, and no library
    installed in the package; returns (library, pristine copy)."""
    (tmp_path / "no-install").mkdir()
    monkeypatch.setattr(ort_ext, "SHIPPED_DIR", tmp_path / "no-install")
    built = Path(library_path())
    folder = tmp_path / "ext"
    folder.mkdir()
    lib = folder / built.name
    shutil.copy2(built, lib)
    shutil.copy2(digest_record(built), digest_record(lib))
    pristine = tmp_path / "pristine.so"
    shutil.copy2(built, pristine)
    monkeypatch.setenv(ort_ext.CACHE_ENV, str(folder))
    return lib, pristine


def _plant(lib: Path, marker: Path) -> None:
    """Replace lib by a library whose constructor writes marker when it is loaded."""
    src = lib.with_suffix(".c")
    src.write_text(EVIL % marker)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)


def _session_options() -> object:
    import onnxruntime as ort

    return ort.SessionOptions()


def test_a_matching_library_is_used_as_is(cache: tuple[Path, Path]) -> None:
    lib, _ = cache
    before = lib.stat().st_mtime_ns
    assert library_path() == str(lib) and verified(lib)
    assert lib.stat().st_mtime_ns == before  # not rebuilt


def test_a_tampered_library_is_rebuilt_not_loaded(
    cache: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, pristine = cache
    marker = tmp_path / "loaded"
    _plant(lib, marker)
    assert not verified(lib)
    rebuilt: list[Path] = []

    def rebuild(out: Path, flags: object) -> None:  # the compile, minus the compiler's time
        rebuilt.append(out)
        shutil.copy2(pristine, out)

    monkeypatch.setattr(ort_ext, "_build", rebuild)
    so = _session_options()
    ort_ext.register(so, ["llmir_ops"])
    assert rebuilt == [lib] and verified(lib)
    assert not marker.exists()  # the planted library's code never ran


def test_a_tampered_library_that_cannot_be_rebuilt_is_refused(
    cache: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, _ = cache
    marker = tmp_path / "loaded"
    _plant(lib, marker)
    monkeypatch.setattr(ort_ext, "_build", lambda out, flags: None)  # leaves the file as it is
    with pytest.raises(CustomOpError, match="does not match the digest recorded"):
        ort_ext.register(_session_options(), ["llmir_ops"])
    assert not marker.exists()


def test_a_library_without_its_record_is_rebuilt(
    cache: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, pristine = cache
    digest_record(lib).unlink()
    calls: list[Path] = []

    def rebuild(out: Path, flags: object) -> None:
        calls.append(out)
        shutil.copy2(pristine, out)
        ort_ext._write_record(out, f"{ort_ext._sha256(out)}  {out.name}\n")

    monkeypatch.setattr(ort_ext, "_build", rebuild)
    assert library_path() == str(lib) and calls == [lib]


def test_the_planted_library_would_run_its_code(tmp_path: Path) -> None:
    """The check above means something: loading the planted file does run its constructor."""
    import ctypes

    lib, marker = tmp_path / "evil.so", tmp_path / "loaded"
    _plant(lib, marker)
    ctypes.CDLL(str(lib))
    assert marker.read_text() == "loaded"


def test_a_cached_library_loads_without_a_compiler(
    cache: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, _ = cache
    _no_compiler(tmp_path, monkeypatch)
    assert ort_ext.unavailable_reason() is None
    ort_ext.register(_session_options(), ["llmir_ops"])
    assert library_path() == str(lib)


# -- the library an install built into the package ---------------------------------------------


@pytest.fixture
def shipped(cache: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package folder as an install leaves it: the library and the install's record (written
    by native/build.py's own writer); the cache is emptied, so a use can only be the shipped
    library. Returns the library."""
    _, pristine = cache
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    lib = pkg / native_build.SHIPPED
    shutil.copy2(pristine, lib)
    native_build.write_record(pkg, native_build.sha256_file(lib))
    monkeypatch.setattr(ort_ext, "SHIPPED_DIR", pkg)
    monkeypatch.setenv(ort_ext.CACHE_ENV, str(tmp_path / "empty-cache"))
    return lib


def test_the_shipped_library_is_used_without_a_compiler(
    shipped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_compiler(tmp_path, monkeypatch)
    assert ort_ext.unavailable_reason() is None
    assert library_path() == str(shipped)
    ort_ext.register(_session_options(), ["llmir_ops"])  # loads it
    assert not (tmp_path / "empty-cache").exists()  # nothing compiled or cached


def test_a_tampered_shipped_library_is_refused_not_loaded(
    shipped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "loaded"
    _plant(shipped, marker)
    with monkeypatch.context() as m:
        _no_compiler(tmp_path, m)
        with pytest.raises(
            CustomOpError, match="does not match the sha256 recorded when the package was built"
        ) as e:
            ort_ext.register(_session_options(), ["llmir_ops"])
    assert "\n" not in e.value.message and "reinstall llmir" in e.value.message
    assert not marker.exists()  # the planted library's code never ran
    # with a compiler there, still refused: a shipped library is never silently replaced
    with pytest.raises(CustomOpError, match="recorded when the package was built"):
        library_path()
    assert not marker.exists()


def test_a_shipped_library_of_other_sources_is_not_used(
    shipped: Path, cache: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editable install whose C sources changed since: compiled at first use instead."""
    lib, _ = cache
    monkeypatch.setenv(ort_ext.CACHE_ENV, str(lib.parent))
    monkeypatch.setattr(native_build, "source_digest", lambda flags=None: "0" * 64)
    assert ort_ext.shipped_library() is None
    assert library_path() != str(shipped)
