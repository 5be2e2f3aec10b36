"""The shared artifact writer (llmir_core.artifact): temp folder, manifest hashes, rename."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from llmir_core.artifact import (
    ARTIFACT_FORMAT,
    ArtifactWriter,
    check_artifact_dir,
    jsonable,
    manifest_head,
)
from llmir_core.artifact_check import open_checked
from llmir_core.errors import CheckFailed, InputError

SOURCE = {"file": "m.llmir", "sha256": "0" * 64}


def _write(out: Path, files: dict[str, bytes], *, fail_after: int | None = None) -> dict:
    with ArtifactWriter(str(out)) as w:
        for i, (name, data) in enumerate(files.items()):
            if fail_after is not None and i == fail_after:
                raise KeyboardInterrupt  # Ctrl-C mid-write
            if "/" in name:
                os.makedirs(os.path.dirname(w.path(name)), exist_ok=True)
            w.write_bytes(name, data)
        head = manifest_head("test", model="model.bin", source=SOURCE, pipeline=["p"])
        return w.finish({**head, "extra": 1})


def _siblings(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_the_manifest_records_every_file_s_sha256_and_size(tmp_path: Path) -> None:
    files = {"model.bin": b"weights" * 100, "kernels/k.ptx": b"ptx text", "notes.txt": b""}
    out = tmp_path / "art"
    manifest = _write(out, files)
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["format"] == ARTIFACT_FORMAT and manifest["target"] == "test"
    assert manifest["source"] == SOURCE and manifest["pipeline"] == ["p"]
    assert set(manifest["files"]) == set(files)
    for name, data in files.items():
        assert manifest["files"][name] == {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
        assert (out / name).read_bytes() == data
    assert _siblings(tmp_path) == ["art"]  # no temp folder left behind
    open_checked(str(out), full=True)  # the checked open accepts what the writer wrote
    (out / "kernels" / "k.ptx").write_bytes(b"ptx TEXT")  # same size, other bytes
    with pytest.raises(CheckFailed, match="k.ptx: sha256"):
        open_checked(str(out), full=True)


def test_a_failure_mid_write_leaves_no_partial_folder(tmp_path: Path) -> None:
    files = {"model.bin": b"a" * 10, "second.bin": b"b" * 10}
    out = tmp_path / "art"
    with pytest.raises(KeyboardInterrupt):
        _write(out, files, fail_after=1)
    assert _siblings(tmp_path) == []  # neither the artifact nor the temp folder
    first = _write(out, files)  # an artifact in place: a failed rebuild keeps it as it was
    with pytest.raises(KeyboardInterrupt):
        _write(out, {"model.bin": b"new", "more.bin": b"x"}, fail_after=1)
    assert _siblings(tmp_path) == ["art"]
    assert json.loads((out / "manifest.json").read_text()) == first
    assert (out / "model.bin").read_bytes() == b"a" * 10


def test_a_rebuild_replaces_its_own_artifact_with_subfolders(tmp_path: Path) -> None:
    out = tmp_path / "art"
    _write(out, {"model.bin": b"1", "kernels/k.ptx": b"k"})
    check_artifact_dir(str(out))  # the listed subfolder file is the artifact's own
    manifest = _write(out, {"model.bin": b"2"})
    assert set(manifest["files"]) == {"model.bin"} and not (out / "kernels").exists()
    (out / "kernels").mkdir()
    (out / "kernels" / "mine.txt").write_text("mine")
    with pytest.raises(InputError, match="it holds 'kernels', which manifest.json does not list"):
        check_artifact_dir(str(out))


def test_jsonable() -> None:
    assert jsonable({1: (2, None), "a": [Path("x"), 1.5, True]}) == {
        "1": [2, None],
        "a": ["x", 1.5, True],
    }
