"""Pulling through huggingface_hub from a fake hub on 127.0.0.1: verification, pinning,
offline runs, directory mirrors, URL registries and hub references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import entry, sha256, tiny_model, write_index
from registry_fakehub import FakeHub

from llmir_core.errors import CheckFailed, InputError
from llmir_core.registry import (
    init_project,
    load_index,
    pull,
    read_lock,
    resolve_model_ref,
    write_mirror,
)


@pytest.fixture
def tiny(tmp_path: Path, hub: FakeHub) -> tuple[dict[str, bytes], str, Path]:
    """org/tiny on the fake hub, and an index whose tiny:1 pins the weights only."""
    files = tiny_model()
    commit = hub.publish("org/tiny", files)
    index = write_index(
        tmp_path / "index.json",
        {
            "tiny:1": entry(
                "org/tiny",
                {"model.safetensors": files["model.safetensors"], "config.json": None},
                include=["*.json"],
            ),
        },
    )
    return files, commit, index


def _snapshot(env: dict[str, str], commit: str) -> Path:
    return Path(env["HF_HOME"]) / "hub" / "models--org--tiny" / "snapshots" / commit


def test_pull_verifies_pins_and_uses_the_hf_cache(env, hub, tiny) -> None:
    files, commit, index = tiny
    result = pull("tiny:1", registry=str(index))
    assert result.root == _snapshot(env, commit)  # HF_HOME is honoured
    assert result.local_path == result.root  # a safetensors folder
    by_path = {f.path: f for f in result.files}
    assert set(by_path) == set(files)  # the include pattern added the other json files
    assert by_path["model.safetensors"].pinned_by == "index"
    assert by_path["tokenizer.json"].pinned_by == "first pull"
    for path, data in files.items():
        assert (result.root / path).read_bytes() == data
        assert result.lock.file(path).sha256 == sha256(data)
    assert result.lock.commit == commit and result.lock.revision == "main"
    # Reproducing the lock from the cache needs no network at all.
    before = hub.connections
    again = pull("tiny:1", registry=str(index), lock=result.lock)
    assert again.lock == result.lock and hub.connections == before


def test_changed_file_on_the_hub_fails_before_download(env, hub, tiny) -> None:
    files, _, index = tiny
    hub.publish("org/tiny", {**files, "model.safetensors": files["model.safetensors"][::-1]})
    with pytest.raises(CheckFailed, match="the hub's file has sha256") as err:
        pull("tiny:1", registry=str(index))
    assert "update the index" in (err.value.hint or "")
    assert not any("model.safetensors" in r[1] and r[0] == "GET" for r in hub.requests)


def test_tampered_download_is_removed_and_not_used(env, hub, tiny) -> None:
    files, commit, index = tiny
    data = files["model.safetensors"]
    hub.tamper("org/tiny", commit, "model.safetensors", data[:-4] + b"\0\0\0\0")  # same size
    with pytest.raises(CheckFailed, match="removed and not used"):
        pull("tiny:1", registry=str(index))
    snapshot = _snapshot(env, commit)
    assert not (snapshot / "model.safetensors").exists()
    blobs = snapshot.parents[1] / "blobs"
    assert sha256(data) not in {p.name for p in blobs.iterdir()}


def test_lock_pins_unpinned_files_and_catches_a_later_change(
    env, hub, tmp_path, monkeypatch
) -> None:
    files = tiny_model()
    commit = hub.publish("org/free", files)
    index = write_index(
        tmp_path / "index.json",
        {"free:1": entry("org/free", {"model.safetensors": None, "config.json": None})},
    )
    first = pull("free:1", registry=str(index))
    assert {f.pinned_by for f in first.files} == {"hub", "first pull"}  # LFS digest / computed
    # Another machine (empty cache) later gets different bytes for the same commit.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "other-hf"))
    hub.tamper("org/free", commit, "config.json", files["config.json"].upper())
    with pytest.raises(CheckFailed, match="pinned by the lock"):
        pull("free:1", registry=str(index), lock=first.lock)


def test_offline_uses_only_the_cache_and_makes_no_connection(env, hub, tiny, monkeypatch) -> None:
    _, commit, index = tiny
    online = pull("tiny:1", registry=str(index))
    before = hub.connections
    offline = pull("tiny:1", registry=str(index), offline=True)
    assert offline.root == online.root and offline.lock.commit == commit
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub's own switch means the same
    assert pull("tiny:1", registry=str(index)).lock == offline.lock
    assert hub.connections == before
    monkeypatch.setenv("HF_HOME", str(Path(env["HF_HOME"]).with_name("empty")))
    with pytest.raises(InputError, match="not in the hub cache") as err:
        pull("tiny:1", registry=str(index), offline=True)
    assert "llmir registry mirror" in (err.value.hint or "")
    assert hub.connections == before


def test_directory_mirror_offline(env, hub, tmp_path) -> None:
    files = tiny_model(seed=3)
    mirror = tmp_path / "mirror"
    write_index(
        mirror / "index.json",
        {"tiny:1": entry("org/tiny", {p: d for p, d in files.items()}, revision="0" * 40)},
    )
    (mirror / "blobs").mkdir()
    for data in files.values():
        (mirror / "blobs" / sha256(data)).write_bytes(data)
    result = pull("tiny:1", registry=str(mirror), offline=True)
    assert hub.connections == 0
    assert not Path(env["HF_HOME"]).exists()  # the hub cache was never touched
    assert all(f.source == "mirror" for f in result.files)
    assert Path(env["LLMIR_HOME"]) in result.root.parents
    assert {p: (result.root / p).read_bytes() for p in files} == files
    # A damaged blob is caught, not used.
    (mirror / "blobs" / sha256(files["config.json"])).write_bytes(b"{}")
    os.remove(result.root / "config.json")
    with pytest.raises(CheckFailed, match="mirror blob"):
        pull("tiny:1", registry=str(mirror), offline=True)
    # A missing blob offline is an input error with a way forward.
    (mirror / "blobs" / sha256(files["config.json"])).unlink()
    with pytest.raises(InputError, match="cannot serve") as err:
        pull("tiny:1", registry=str(mirror), offline=True)
    assert "llmir registry mirror" in (err.value.hint or "")


def test_mirror_command_then_air_gapped_pull(env, hub, tiny, tmp_path, monkeypatch) -> None:
    _, commit, index = tiny
    mirror = tmp_path / "mirror"
    result = write_mirror(mirror, ["tiny:1"], registry=str(index))
    assert result.added == ["tiny:1"] and result.blobs_written == 4
    mirrored = load_index(str(mirror))
    assert mirrored.entries["tiny:1"].revision == commit and mirrored.entries["tiny:1"].pinned
    monkeypatch.setenv("HF_HOME", str(tmp_path / "fresh-hf"))
    before = hub.connections
    pulled = pull("tiny:1", registry=str(mirror), offline=True)
    assert hub.connections == before and pulled.lock.commit == commit


def test_url_registry_is_cached_for_offline_use(env, hub, tiny) -> None:
    _, _, index = tiny
    hub.static["/reg/index.json"] = index.read_bytes()
    url = hub.url + "/reg/index.json"
    assert set(load_index(url).entries) == {"tiny:1"}
    before = hub.connections
    assert load_index(url, offline=True).kind == "url"
    assert hub.connections == before
    with pytest.raises(InputError, match="no cached copy"):
        load_index(hub.url + "/other/index.json", offline=True)


def test_hf_references(env, hub) -> None:
    files = tiny_model()
    hub.publish("org/st", {**files, "README.md": b"# hi", "onnx/model.json": b"{}"})
    result = pull("hf:org/st")
    assert {f.path for f in result.files} == set(files)  # top-level weights, configs, tokenizer
    assert result.lock.kind == "hf" and result.lock.format == "safetensors"
    hub.publish(
        "org/gg", {"a-q4_0.gguf": b"GGUF" + b"\1" * 60, "a-q8_0.gguf": b"GGUF" + b"\2" * 60}
    )
    with pytest.raises(InputError, match="2 GGUF files") as err:
        pull("hf:org/gg")
    assert "hf:org/gg/a-q4_0.gguf" in (err.value.hint or "")
    single = pull("hf:org/gg/a-q8_0.gguf@main")
    assert single.local_path.name == "a-q8_0.gguf" and single.local_path.is_file()
    with pytest.raises(InputError, match="no repository org/missing"):
        pull("hf:org/missing")
    with pytest.raises(InputError, match="no revision 'v9'"):
        pull("hf:org/st@v9")


def test_index_naming_a_missing_file(env, hub, tmp_path) -> None:
    hub.publish("org/tiny", tiny_model())
    index = write_index(
        tmp_path / "index.json",
        {"t:1": entry("org/tiny", {"model.safetensors": None, "absent.json": None})},
    )
    with pytest.raises(InputError, match="has no file absent.json"):
        pull("t:1", registry=str(index))


def test_local_path_is_locked_and_checked(env, tmp_path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    for path, data in tiny_model().items():
        (model / path).write_bytes(data)
    first = pull(str(model))
    assert first.kind == "path" and first.local_path == model.resolve()
    (model / "config.json").write_text("{}")
    with pytest.raises(CheckFailed, match="changed since llmir.lock"):
        pull(str(model), lock=first.lock)


def test_resolve_model_ref_follows_the_project_lock(env, hub, tiny, tmp_path) -> None:
    files, commit, index = tiny
    project = tmp_path / "proj"
    init_project(project, model="tiny:1", registry=str(index))
    hub.publish("org/tiny", {**files, "tokenizer.json": b'{"changed": true}'})  # main moves on
    path = resolve_model_ref("tiny:1", registry=str(index), offline=False, project=project)
    assert path == _snapshot(env, commit)
    # Without the project the reference follows the branch to its new commit.
    fresh = resolve_model_ref("tiny:1", registry=str(index), offline=False, project=tmp_path)
    assert fresh != path and json.loads((fresh / "tokenizer.json").read_text()) == {"changed": True}
    assert read_lock(project / "llmir.lock").commit == commit
