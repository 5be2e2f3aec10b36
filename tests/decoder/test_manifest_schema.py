"""manifest.json has a versioned JSON schema (llmir_core/runtime/manifest.schema.json): every
manifest `llmir build` writes validates, and an edited field is one line naming it, exit 2,
before any field is used (no exit 70, no string read letter by letter)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.artifact_check import manifest_schema, read_manifest
from llmir_core.json_schema import validate

PLAIN = """module @m {
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = core.add %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
"""


def _manifest(art: Path) -> dict[str, Any]:
    return json.loads((art / "manifest.json").read_text())  # type: ignore[no-any-return]


def test_the_schema_ships_in_the_package() -> None:
    shipped = resources.files("llmir_core.runtime") / "manifest.schema.json"
    assert json.loads(shipped.read_text(encoding="utf-8")) == manifest_schema()
    assert manifest_schema()["properties"]["schema_version"] == {"const": 1}
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"llmir_core.runtime" = ["*.json"]' in pyproject


def test_onnxruntime_decoder_manifest_validates(tiny_artifact: Path) -> None:
    m = _manifest(tiny_artifact)
    assert validate(m, manifest_schema()) == []
    assert m["custom_ops"] and m["decoder"]["cache"]  # the fields this file guards are there
    assert read_manifest(str(tiny_artifact)) == m


def test_onnxruntime_plain_manifest_validates(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="building for onnxruntime needs onnx")
    (tmp_path / "m.llmir").write_text(PLAIN)
    r = CliRunner().invoke(app, ["build", str(tmp_path / "m.llmir"), "-o", str(tmp_path / "art")])
    assert r.exit_code == 0, r.stderr
    m = _manifest(tmp_path / "art")
    assert "decoder" not in m and validate(m, manifest_schema()) == []


def test_triton_manifest_validates(tiny_module: Any, tmp_path: Path) -> None:
    from llmir_core.targets.triton.target import TARGET

    TARGET.serialize(tiny_module, str(tmp_path / "tr"), arch="none")  # no AOT kernels: no GPU
    m = _manifest(tmp_path / "tr")
    assert m["target"] == "triton" and m["weight_index"]
    assert validate(m, manifest_schema()) == []
    assert read_manifest(str(tmp_path / "tr")) == m


def _drop_cache(m: dict[str, Any]) -> None:
    del m["decoder"]["cache"]


def _drop_output(m: dict[str, Any]) -> None:
    del m["decoder"]["cache"][1]["output"]


EDITS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "custom_ops a number": (
        lambda m: m.update(custom_ops=5),
        "field 'custom_ops': expected array, got integer",
    ),
    "custom_ops a string": (
        lambda m: m.update(custom_ops="llmir_ops"),
        "field 'custom_ops': expected array, got string",
    ),
    "custom_ops a path": (
        lambda m: m.update(custom_ops=["../evil"]),
        "field 'custom_ops[0]': '../evil' does not match",
    ),
    "decoder.cache missing": (_drop_cache, "field 'decoder': missing required field 'cache'"),
    "decoder.cache an object": (
        lambda m: m["decoder"].update(cache={}),
        "field 'decoder.cache': expected array, got object",
    ),
    "decoder.cache entry a string": (
        lambda m: m["decoder"].update(cache=["x"]),
        "field 'decoder.cache[0]': expected object, got string",
    ),
    "decoder.cache entry without output": (
        _drop_output,
        "field 'decoder.cache[1]': missing required field 'output'",
    ),
    "decoder.vocab a string": (
        lambda m: m["decoder"].update(vocab="128"),
        "field 'decoder.vocab': expected integer, got string",
    ),
    "decoder.prepack unknown": (
        lambda m: m["decoder"].update(prepack="fast"),
        "field 'decoder.prepack': 'fast' is not one of 'session', 'none'",
    ),
    "decoder.tokenizer a number": (
        lambda m: m["decoder"].update(tokenizer=5),
        "field 'decoder.tokenizer': expected object or null, got integer",
    ),
    "decoder.eos_token_ids negative": (
        lambda m: m["decoder"].update(eos_token_ids=[-1]),
        "field 'decoder.eos_token_ids[0]': -1 is less than 0",
    ),
    "schema_version from the future": (
        lambda m: m.update(schema_version=2),
        "field 'schema_version': expected 1, got 2",
    ),
    "decoder a list": (
        lambda m: m.update(decoder=[]),
        "field 'decoder': expected object, got array",
    ),
}


@pytest.fixture
def art(tiny_artifact: Path, tmp_path: Path) -> Path:
    out = tmp_path / "art"
    shutil.copytree(tiny_artifact, out)
    return out


def _edit(art: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    m = _manifest(art)
    edit(m)
    (art / "manifest.json").write_text(json.dumps(m))


def _rejected(args: list[str], art: Path, message: str) -> None:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.stderr, r.exception)
    lines = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{art / 'manifest.json'}: {message}" in lines[0], lines[0]


@pytest.mark.parametrize("case", list(EDITS))
def test_an_edited_field_is_one_line_naming_it(art: Path, case: str) -> None:
    edit, message = EDITS[case]
    _edit(art, edit)
    _rejected(["run", str(art), "--prompt", "ab", "-n", "1"], art, message)


@pytest.mark.parametrize("case", ["custom_ops a number", "decoder.cache missing"])
def test_serve_refuses_an_edited_manifest(art: Path, case: str) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    edit, message = EDITS[case]
    _edit(art, edit)
    _rejected(["serve", str(art), "--port", "0"], art, message)
