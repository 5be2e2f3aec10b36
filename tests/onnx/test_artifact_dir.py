"""`llmir build -o DIR` replaces DIR only when it is provably an llmir artifact: its manifest.json
says so and the folder holds nothing but the files the manifest lists. Anything else is refused
with exit 2 and left exactly as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import llmir_core.targets.onnxruntime.graph as ort
from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.fileio import replace_dir

SRC = """module @m {
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = core.add %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
"""


def _build(src: Path, out: Path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["build", str(src), "-o", str(out)])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stderr


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    p = tmp_path / "m.llmir"
    p.write_text(SRC)
    return p


WEB_MANIFEST = json.dumps({"name": "My App", "short_name": "app", "start_url": "/", "icons": []})


@pytest.mark.parametrize(
    "files, why",
    [
        (
            {"manifest.json": "", "index.html": "<html>"},
            "manifest.json is not an llmir manifest (not JSON)",
        ),
        (
            {"manifest.json": WEB_MANIFEST, "index.html": "<html>"},
            "manifest.json is not an llmir manifest",
        ),
        ({"manifest.json": "[]", "notes.txt": "mine"}, "not a JSON object"),
        ({"manifest.json": b"\xff\xfe{", "a.txt": "x"}, "not JSON"),
        ({"manifest.json": "[" * 100_000, "a.txt": "x"}, "not JSON"),
        ({"manifest.json": json.dumps({"format": "llmir-artifact"}), "a": "x"}, "lists no files"),
        ({"notes.txt": "mine"}, "no manifest.json"),
    ],
)
def test_foreign_folders_are_refused(
    src: Path, tmp_path: Path, files: dict[str, str | bytes], why: str
) -> None:
    out = tmp_path / "site"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    before = _tree(out)
    code, err = _build(src, out)
    assert code == 2, err
    assert "is not an llmir artifact" in err and why in err and "hint:" in err, err
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["m.llmir", "site"]  # no temp folder left


def test_an_artifact_with_an_extra_file_is_refused(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    assert _build(src, out)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "llmir-artifact"
    (out / "my-notes.txt").write_text("mine")
    before = _tree(out)
    code, err = _build(src, out)
    assert code == 2 and "it holds 'my-notes.txt', which manifest.json does not list" in err, err
    assert _tree(out) == before
    os.remove(out / "my-notes.txt")
    (out / "sub").mkdir()
    (out / "sub" / "keep.txt").write_text("mine")
    code, err = _build(src, out)
    assert code == 2 and "'sub'" in err and (out / "sub" / "keep.txt").read_text() == "mine"


def test_a_listed_name_that_is_a_folder_is_refused(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    assert _build(src, out)[0] == 0
    os.remove(out / "model.onnx")
    (out / "model.onnx").mkdir()
    (out / "model.onnx" / "keep.txt").write_text("mine")
    code, err = _build(src, out)
    assert code == 2 and "'model.onnx' is not a regular file" in err, err
    assert (out / "model.onnx" / "keep.txt").read_text() == "mine"


def test_a_symlinked_output_folder_is_refused(src: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    code, err = _build(src, tmp_path / "link")
    assert code == 2 and "is a symbolic link" in err, err
    assert (tmp_path / "link").is_symlink() and os.listdir(real) == []


def test_own_artifacts_empty_folders_and_older_manifests_are_replaced(
    src: Path, tmp_path: Path
) -> None:
    out = tmp_path / "art"
    out.mkdir()
    assert _build(src, out)[0] == 0  # an empty folder
    first = _tree(out)
    assert _build(src, out)[0] == 0  # its own artifact
    assert _tree(out) == first
    legacy = json.loads((out / "manifest.json").read_text())
    del legacy["format"]  # written before the marker existed
    (out / "manifest.json").write_text(json.dumps(legacy))
    assert _build(src, out)[0] == 0
    assert _tree(out) == first


def test_a_file_added_during_the_build_stops_the_swap(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "art"
    assert _build(src, out)[0] == 0
    real = ort.to_onnx

    def to_onnx_while_the_user_writes(*a: object, **k: object) -> object:
        (out / "draft.txt").write_text("written while llmir was building")
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(ort, "to_onnx", to_onnx_while_the_user_writes)
    code, err = _build(src, out)
    assert code == 2 and "'draft.txt'" in err, err
    assert (out / "draft.txt").read_text() == "written while llmir was building"
    assert sorted(os.listdir(tmp_path)) == ["art", "m.llmir"]


def test_replace_dir_guard_runs_before_the_swap(tmp_path: Path) -> None:
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "keep").write_text("x")

    def refuse(path: str) -> None:
        raise InputError(f"{path}: no")

    with pytest.raises(InputError):
        replace_dir(str(tmp_path / "new"), str(tmp_path / "old"), guard=refuse)
    assert (tmp_path / "old" / "keep").read_text() == "x" and (tmp_path / "new").is_dir()
