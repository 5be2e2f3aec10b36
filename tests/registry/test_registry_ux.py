"""Small UX defects, each with its test: parameter counts under a million, a bare model name
given to `import`, the meaning of `import --format json`, and hints on bad sampling options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli, entry, write_index

from llmir_cli.commands.registry import _params


def test_parameter_counts_keep_their_magnitude(env, tmp_path: Path) -> None:
    assert [_params(n) for n in (950, 123_000, 135_000_000, 1_240_000_000)] == [
        "950",
        "123K",
        "135M",
        "1.24B",
    ]
    small = entry("org/small", {"model.safetensors": b"x"})
    small["parameters"] = 123_000
    index = write_index(tmp_path / "index.json", {"small:1": small})
    r = cli("registry", "list", "--registry", str(index))
    assert r.returncode == 0, r.stderr
    row = r.stdout.splitlines()[1].split()
    assert row[0] == "small:1" and row[3] == "123K", r.stdout


def test_import_takes_a_bare_model_name_like_init(env, tmp_path: Path) -> None:
    r = cli("import", "smollm2", "-o", str(tmp_path / "x.llmir"), "--offline")
    assert r.returncode == 2
    assert "unknown model 'smollm2:latest'" in r.stderr and "did you mean smollm2:135m" in r.stderr
    assert "no such file" not in r.stderr
    r = cli("import", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "x.llmir"))
    assert r.returncode == 2 and "no such file or folder" in r.stderr  # a path stays a path


def test_import_json_says_what_it_did_and_from_what(env, tmp_path: Path) -> None:
    from tests.onnx.models import mlp, save

    save(mlp(), str(tmp_path / "m.onnx"), external=True)
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.llmir"), "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["kind"] == "import" and data["source_format"] == "onnx", data
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m2.llmir"))
    assert "(from ONNX model " in r.stdout, r.stdout


@pytest.mark.parametrize(
    "args, hint",
    [
        (["-n", "0"], "hint: give the number of tokens to generate"),
        (["--temperature", "-1"], "hint: 0 picks the most likely token"),
        (["--top-p", "0"], "hint: 1 turns top-p off"),
        (["--top-k", "-1"], "hint: 0 turns top-k off"),
        (["--repetition-penalty", "0"], "hint: 1 turns it off"),
    ],
)
def test_bad_sampling_options_come_with_a_hint(tmp_path: Path, args: list[str], hint: str) -> None:
    r = cli("run", str(tmp_path), "--prompt", "hi", *args)
    assert r.returncode == 2 and hint in r.stderr, r.stderr
