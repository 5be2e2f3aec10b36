"""The cached custom-op library is loaded only when its sha256 matches the record written when it
was built (llmir_core/targets/onnxruntime/native/__init__.py): a tampered file is rebuilt, or refused when
it cannot be, and never loaded (its constructor never runs)."""

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


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A private cache holding a copy of the built library and its record; returns (library,
    pristine copy)."""
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
