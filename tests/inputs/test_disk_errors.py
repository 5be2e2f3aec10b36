"""A full or read-only disk during `llmir build`: one line naming the problem (exit 2, not an
internal error) and nothing left behind, neither the output folder nor its temp folder."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.inputs.helpers import invoke, listing, rejected

TEXT = """module @m {
  func.func @main(%x: tensor<?b x 16 x f32>) -> tensor<?b x 16 x f32> {
    %w = core.weight {file = "w.bin", name = "w", nbytes = 1024, offset = 0} : () -> tensor<16x16xf32>
    %y = core.matmul %x, %w : (tensor<?b x 16 x f32>, tensor<16x16xf32>) -> tensor<?b x 16 x f32>
    return %y : tensor<?b x 16 x f32>
  }
}
"""


def _module(tmp_path: Path) -> Path:
    np.ones((16, 16), np.float32).tofile(tmp_path / "w.bin")
    (tmp_path / "m.llmir").write_text(TEXT)
    return tmp_path / "m.llmir"


def _raise(code: int):  # type: ignore[no-untyped-def]
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    return fail


def test_read_only_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _module(tmp_path)
    before = listing(tmp_path)
    monkeypatch.setattr("tempfile.mkdtemp", _raise(errno.EROFS))
    code, out, err = invoke("build", str(f), "-o", str(tmp_path / "out"))
    line = rejected(
        code, err, expect=2, names=f"{tmp_path / 'out'}: cannot create the artifact in {tmp_path}"
    )
    assert "Read-only file system" in line
    assert listing(tmp_path) == before


def test_disk_full_while_writing_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _module(tmp_path)
    before = listing(tmp_path)
    monkeypatch.setattr(os, "pwrite", _raise(errno.ENOSPC))
    monkeypatch.setattr(os, "copy_file_range", _raise(errno.ENOSPC), raising=False)
    code, out, err = invoke("build", str(f), "-o", str(tmp_path / "out"))
    rejected(code, err, expect=2, names="No space left on device")
    assert "hint: free disk space" in err
    assert listing(tmp_path) == before


@pytest.mark.parametrize("which", ["generic", "decoder"])
def test_file_size_limit_during_build(tmp_path: Path, which: str, llama_dir: Path) -> None:
    """A real write failure (EFBIG under RLIMIT_FSIZE, as a full disk fails writes) in a subprocess."""
    if which == "generic":
        f = _module(tmp_path)
    else:
        from llmir_core.frontends.hf import import_hf
        from llmir_core.ir.printer import print_module

        f = tmp_path / "m.llmir"
        f.write_text(print_module(import_hf(llama_dir, f)))
    before = listing(tmp_path)
    script = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
        from llmir_cli.app import app
        sys.argv = ["llmir", "build", {str(f)!r}, "-o", {str(tmp_path / "out")!r}]
        app()
    """)
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    line = rejected(r.returncode, r.stderr, expect=2)
    assert "File too large" in line
    assert listing(tmp_path) == before
