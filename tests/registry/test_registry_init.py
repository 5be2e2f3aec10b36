"""`llmir init` through the real CLI: a real pull (with a dropped connection resumed), the
project files, offline runs, reproducing a lock, and every refusal with its exit code."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import tomllib
from conftest import cli, entry, llmir, safetensors_bytes, sha256, tiny_model, write_index
from registry_fakehub import FakeHub

from llmir_core.errors import InputError
from llmir_core.registry import init_project, project

BIG = 11 * 1024 * 1024  # over huggingface_hub's 10 MiB write chunk, so a resume has bytes to keep


@pytest.fixture
def tiny(tmp_path: Path, hub: FakeHub) -> tuple[dict[str, bytes], str, Path]:
    files = tiny_model()
    commit = hub.publish("org/tiny", files)
    index = write_index(
        tmp_path / "index.json",
        {
            "tiny:1": entry(
                "org/tiny",
                {"model.safetensors": files["model.safetensors"], "config.json": None},
                include=["*.json"],
            )
        },
    )
    return files, commit, index


def test_init_real_pull_resumes_after_a_dropped_connection(env, hub, tmp_path) -> None:
    files = {**tiny_model(), "model.safetensors": safetensors_bytes(BIG // 4)}
    commit = hub.publish("org/big", files)
    index = write_index(
        tmp_path / "index.json",
        {
            "big:1": entry(
                "org/big",
                {"model.safetensors": files["model.safetensors"], "config.json": None},
                include=["*.json"],
            )
        },
    )
    hub.cut_after["model.safetensors"] = BIG - 100_000  # drop the connection near the end
    proj = tmp_path / "proj"
    r = llmir(env, "init", str(proj), "--model", "big:1", "--registry", str(index), "-v")
    assert r.returncode == 0, r.stderr
    ranges = [rng for method, _, rng in hub.file_requests("model.safetensors") if method == "GET"]
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")
    assert int(ranges[1][6:].rstrip("-")) >= 10 * 1024 * 1024  # resumed, not restarted
    lock = tomllib.loads((proj / "llmir.lock").read_text())
    assert lock["model"]["commit"] == commit
    assert {f["path"]: f["sha256"] for f in lock["files"]} == {
        p: sha256(d) for p, d in files.items()
    }
    toml = tomllib.loads((proj / "llmir.toml").read_text())
    assert toml["model"]["ref"] == "big:1" and toml["build"] == {
        "target": "onnxruntime",
        "opt_level": 2,
    }
    assert "paths" not in toml  # no command reads a [paths] table
    # Result on stdout, logs on stderr, no progress bar in a pipe.
    assert r.stdout.startswith(f"initialised {proj} for big:1")
    assert "downloading org/big/model.safetensors" in r.stderr
    assert "\r" not in r.stderr and "━" not in r.stderr


def test_init_json_output_and_offline_rerun(env, hub, tiny, tmp_path) -> None:
    files, commit, index = tiny
    r = cli(
        "init",
        str(tmp_path / "a"),
        "-m",
        "tiny:1",
        "--registry",
        str(index),
        "--format",
        "json",
        "-O",
        "3",
        "--target",
        "onnxruntime",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["schema_version"] == 1 and data["kind"] == "init" and data["ok"] is True
    assert data["opt_level"] == 3 and data["target"] == "onnxruntime"
    assert data["model"]["lock"]["commit"] == commit
    assert len(data["model"]["files"]) == len(files)
    before = hub.connections
    r = llmir(
        env,
        "init",
        str(tmp_path / "b"),
        "-m",
        "tiny:1",
        "--registry",
        str(index),
        "--offline",
        "-q",
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # --quiet: results and errors only
    assert hub.connections == before  # --offline made no connection at all
    assert (tmp_path / "b" / "llmir.lock").read_text() == (
        tmp_path / "a" / "llmir.lock"
    ).read_text()


def test_init_offline_from_a_directory_registry(env, hub, tmp_path) -> None:
    files = tiny_model(seed=5)
    mirror = tmp_path / "mirror"
    write_index(mirror / "index.json", {"tiny:1": entry("org/tiny", dict(files))})
    (mirror / "blobs").mkdir()
    for data in files.values():
        (mirror / "blobs" / sha256(data)).write_bytes(data)
    r = cli("init", str(tmp_path / "p"), "-m", "tiny:1", "--registry", str(mirror), "--offline")
    assert r.returncode == 0, r.stderr
    assert hub.connections == 0


def test_init_reproduces_an_existing_lock(env, hub, tiny, tmp_path) -> None:
    _, _, index = tiny
    proj = tmp_path / "proj"
    assert cli("init", str(proj), "-m", "tiny:1", "--registry", str(index)).returncode == 0
    (proj / "model.llmir").write_text("later stages write here\n")
    lock_before = (proj / "llmir.lock").read_bytes()
    r = cli("init", "--registry", str(index), cwd=proj)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("reproduced llmir.lock in .")
    assert (proj / "llmir.lock").read_bytes() == lock_before
    r = cli("init", "-m", "other:1", cwd=proj)
    assert r.returncode == 2
    assert "pins tiny:1, not other:1" in r.stderr and "--force" in r.stderr


def test_init_refuses_when_the_lock_disagrees_with_the_index(env, hub, tiny, tmp_path) -> None:
    files, _, index = tiny
    proj = tmp_path / "proj"
    init_project(proj, model="tiny:1", registry=str(index))
    changed = json.loads(index.read_text())
    changed["models"]["tiny:1"]["files"][0]["sha256"] = "f" * 64
    index.write_text(json.dumps(changed))
    r = cli("init", str(proj), "--registry", str(index))
    assert r.returncode == 2
    assert "llmir.lock disagrees with the index" in r.stderr
    assert "model.safetensors: sha256 lock" in r.stderr
    assert "hint: if the index changed on purpose, `llmir init --force`" in r.stderr


def test_init_refuses_a_non_empty_folder_unless_forced(env, hub, tiny, tmp_path) -> None:
    _, _, index = tiny
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "notes.txt").write_text("mine")
    r = cli("init", str(proj), "-m", "tiny:1", "--registry", str(index))
    assert r.returncode == 2
    assert f"error: {proj} is not empty (notes.txt)" in r.stderr and "--force" in r.stderr
    assert sorted(p.name for p in proj.iterdir()) == ["notes.txt"]
    assert hub.connections == 0  # refused before any download
    r = cli("init", str(proj), "-m", "tiny:1", "--registry", str(index), "--force")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in proj.iterdir()) == ["llmir.lock", "llmir.toml", "notes.txt"]


def test_init_unknown_name_and_bad_digest_exit_codes(env, hub, tiny, tmp_path) -> None:
    files, commit, index = tiny
    r = cli("init", str(tmp_path / "p"), "-m", "tiny:2", "--registry", str(index))
    assert r.returncode == 2 and "did you mean tiny:1" in r.stderr
    hub.tamper("org/tiny", commit, "model.safetensors", files["model.safetensors"][::-1])
    r = cli("init", str(tmp_path / "p"), "-m", "tiny:1", "--registry", str(index))
    assert r.returncode == 1  # a check failed
    assert "removed and not used" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p").exists()  # nothing half-written


def test_init_into_a_path_under_a_file_fails_cleanly(env, hub, tiny, tmp_path) -> None:
    _, _, index = tiny
    (tmp_path / "file").write_text("x")
    r = cli("init", str(tmp_path / "file" / "proj"), "-m", "tiny:1", "--registry", str(index))
    assert r.returncode == 2
    assert "is not a folder" in r.stderr and "hint:" in r.stderr
    assert hub.connections == 0


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0,
    reason="permissions do not stop root; the disk-full test covers the rollback",
)
def test_init_into_a_read_only_folder(env, hub, tiny, tmp_path) -> None:
    _, _, index = tiny
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        r = cli("init", str(locked / "proj"), "-m", "tiny:1", "--registry", str(index))
        assert r.returncode == 2 and "permission denied" in r.stderr
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_disk_full_while_writing_leaves_nothing(env, hub, tiny, tmp_path, monkeypatch) -> None:
    _, _, index = tiny
    proj = tmp_path / "new" / "proj"
    real_replace = os.replace
    calls: list[str] = []

    def full_disk(src: str, dst: object) -> None:
        calls.append(str(dst))
        if len(calls) == 2:  # the second of the two files fails
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst)

    monkeypatch.setattr(project.os, "replace", full_disk)
    with pytest.raises(InputError, match="No space left on device") as err:
        init_project(proj, model="tiny:1", registry=str(index))
    assert "nothing was written" in (err.value.hint or "")
    assert not (tmp_path / "new").exists()  # even the folders it created are gone
