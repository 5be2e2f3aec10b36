"""llmir.toml is honest: --target is checked, a relative --registry works from the project's
own folder, and the [build] table is what `llmir build` / `llmir optimize` there default to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tomllib
from conftest import cli, entry, sha256, tiny_model, write_index

REPO = Path(__file__).resolve().parents[2]


def test_init_refuses_an_unknown_target(env, hub, tmp_path) -> None:
    r = cli("init", str(tmp_path / "p"), "-m", "tiny:1", "--target", "nonsense")
    assert r.returncode == 2
    assert (
        "error: unknown --target 'nonsense'" in r.stderr
        and "hint: known targets: onnxruntime" in r.stderr
    )
    assert not (tmp_path / "p").exists()


def test_a_relative_registry_works_from_the_project_folder(env, hub, tmp_path) -> None:
    files = tiny_model(seed=7)
    mirror = tmp_path / "mirror"
    write_index(mirror / "index.json", {"tiny:1": entry("org/tiny", dict(files))})
    (mirror / "blobs").mkdir()
    for data in files.values():
        (mirror / "blobs" / sha256(data)).write_bytes(data)
    r = cli("init", "demo", "-m", "tiny:1", "--registry", "./mirror", "--offline", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    toml = tomllib.loads((tmp_path / "demo" / "llmir.toml").read_text())
    assert toml["model"]["registry"] == "../mirror"  # relative to the project folder
    shutil.rmtree(env["HF_HOME"], ignore_errors=True)  # only the stored registry has the files
    r = cli("init", "--offline", cwd=tmp_path / "demo")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("reproduced llmir.lock")
    assert hub.connections == 0


def test_build_and_optimize_default_to_the_projects_build_table(env, tmp_path) -> None:
    (tmp_path / "llmir.toml").write_text(
        '[model]\nref = "tiny:1"\n\n[build]\ntarget = "tpu"\nopt_level = 0\n'
    )
    src = tmp_path / "m.llmir"
    shutil.copy(REPO / "examples" / "decoder.llmir", src)
    r = cli("optimize", "m.llmir", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["passes"] == []  # -O0 from llmir.toml: no pass ran
    r = cli("optimize", "m.llmir", "-O", "1", "--format", "json", cwd=tmp_path)
    assert [p["pass"] for p in json.loads(r.stdout)["passes"]][:1] == ["canonicalize"]  # -O wins
    r = cli("build", "m.llmir", "-o", "art", cwd=tmp_path)
    assert r.returncode == 2 and "unknown target 'tpu'" in r.stderr, r.stderr
    assert not (tmp_path / "art").exists()
