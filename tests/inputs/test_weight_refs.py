"""Weight references `run` reads: the same located checks as `verify` and `build` (exit 1), never
an internal error; a pinned sha256 that does not match the bytes fails every command (exit 1)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from tests.inputs.helpers import invoke, rejected

TEXT = """module @m {
  func.func @main(%x: tensor<?b x 4 x f32>) -> tensor<?b x 4 x f32> {
    %w = core.weight {file = "FILE", name = "w", nbytes = 64, offset = OFF SHA} : () -> tensor<WT>
    %y = core.matmul %x, %w : (tensor<?b x 4 x f32>, tensor<WT>) -> tensor<?b x 4 x f32>
    return %y : tensor<?b x 4 x f32>
  }
}
"""
W = np.arange(16, dtype=np.float32).reshape(4, 4)
SHA = hashlib.sha256(W.tobytes()).hexdigest()


def _module(
    tmp_path: Path, file: str = "w.bin", off: str = "0", sha: str | None = None, wt: str = "4x4xf32"
) -> str:
    W.tofile(tmp_path / "w.bin")
    (tmp_path / "adir").mkdir(exist_ok=True)
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    pin = f', sha256 = "{sha}"' if sha else ""
    f = tmp_path / "m.llmir"
    f.write_text(
        TEXT.replace("FILE", file).replace("OFF", off).replace(" SHA", pin).replace("WT", wt)
    )
    return str(f)


CASES = {
    "offset past the end": ({"off": "8"}, "needs bytes 8..72 but w.bin has only 64 bytes"),
    "negative offset": ({"off": "-8"}, "offset -8 is negative"),
    "missing file": ({"file": "nope.bin"}, "weight file nope.bin not found"),
    "a folder": ({"file": "adir"}, "weight file adir is a folder, not a file"),
    "dynamic shape": ({"wt": "?n x 4 x f32"}, "a weight needs a static tensor type"),
    "pinned sha256 differs": (
        {"sha": "0" * 64},
        f"sha256 of its bytes in w.bin is {SHA}, but the reference pins",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["run", "verify", "build"])
def test_bad_weight_reference_is_located(tmp_path: Path, case: str, command: str) -> None:
    kw, message = CASES[case]
    f = _module(tmp_path, **kw)
    args = {
        "run": ["run", f, "--input", f"x={tmp_path / 'x.npy'}"],
        "verify": ["verify", f],
        "build": ["build", f, "-o", str(tmp_path / "out")],
    }[command]
    code, out, err = invoke(*args)
    line = rejected(code, err, expect=1, names=f"{f}:3:")
    assert message in line
    assert not (tmp_path / "out").exists()


def test_pinned_sha256_that_matches_runs(tmp_path: Path) -> None:
    f = _module(tmp_path, sha=SHA)
    code, out, err = invoke(
        "run", f, "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "o")
    )
    assert code == 0, err
    np.testing.assert_allclose(
        np.load(
            tmp_path / "o" / "y.npy"
            if (tmp_path / "o" / "y.npy").exists()
            else next((tmp_path / "o").iterdir())
        ),
        np.ones((2, 4)) @ W,
    )


def test_interpreter_names_the_weight_when_its_file_changes_after_verify(tmp_path: Path) -> None:
    """The reference interpreter checks each weight as it maps it (a file can shrink between
    verification and use): a located check failure, not an internal error."""
    from llmir_core.errors import CheckFailed
    from llmir_core.interp import run
    from llmir_core.ir.parser import parse_file

    module = parse_file(_module(tmp_path))
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)
    with pytest.raises(
        CheckFailed, match=r"m.llmir:3:10: core.weight: tensor 'w' needs bytes 0..64"
    ):
        run(module, {"x": np.ones((2, 4), np.float32)})
