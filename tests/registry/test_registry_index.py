"""The index: the shipped one validates, bad ones are reported at their line, names resolve
with suggestions, and `llmir registry list|show|search` keep the output contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli, entry, llmir, write_index

from llmir_core.errors import InputError
from llmir_core.registry import HfRef, PathRef, RegistryRef, load_index, parse_ref
from llmir_core.registry.index import schema, shipped_index_path
from llmir_core.registry.schema import validate

REQUIRED = [
    "qwen2.5:0.5b-q4_0",
    "qwen2.5:0.5b",
    "llama3.2:1b-instruct-q8_0",
    "phi3:mini-q4_1",
    "smollm2:135m",
    "smollm2:135m-q8_0",
]


def test_shipped_index_validates_against_its_schema() -> None:
    raw = json.loads(shipped_index_path().read_text())
    assert validate(raw, schema()) == []
    index = load_index(None)
    assert index.kind == "shipped"
    assert set(REQUIRED) <= set(index.entries)
    for e in index.entries.values():
        assert e.license and e.parameters > 0 and e.files
        # A digest is either pinned (64 hex) or honestly absent.
        assert all(f.sha256 is None or len(f.sha256) == 64 for f in e.files)


def test_schema_uses_only_keywords_the_validator_knows() -> None:
    # validate() raises on an unknown keyword; walking every entry exercises every subschema.
    validate(json.loads(shipped_index_path().read_text()), schema())


@pytest.mark.parametrize(
    ("mutate", "line_of", "message"),
    [
        # Why: a wrong type deep inside an entry must point at that field's line.
        (
            lambda m: m["a:b"]["files"][0].__setitem__("size", "big"),
            '"size"',
            "expected integer or null",
        ),
        # Why: a digest that is not 64 hex characters is a schema error, not a later mismatch.
        (lambda m: m["a:b"]["files"][0].__setitem__("sha256", "abc"), '"sha256"', "does not match"),
        # Why: typos in field names must not be ignored silently.
        (lambda m: m["a:b"].__setitem__("licence", "mit"), '"licence"', "unknown field 'licence'"),
        # Why: an enum violation names the allowed values.
        (lambda m: m["a:b"].__setitem__("format", "onnx"), '"format"', "not one of"),
    ],
)
def test_malformed_index_reports_the_line(
    tmp_path: Path, mutate, line_of: str, message: str
) -> None:
    models = {"a:b": entry("org/repo", {"model.safetensors": b"x"})}
    mutate(models)
    path = write_index(tmp_path / "index.json", models)
    with pytest.raises(InputError) as err:
        load_index(str(path))
    lines = path.read_text().splitlines()
    expected_line = next(i for i, text in enumerate(lines, 1) if line_of in text)
    diag = err.value.diagnostics[0]
    assert diag.pos is not None and diag.pos.line == expected_line
    assert message in diag.message
    assert err.value.hint and "index.schema.json" in err.value.hint


def test_json_syntax_error_and_duplicate_key_have_lines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "index_version": 1,\n  "models": {,}\n}\n')
    with pytest.raises(InputError) as err:
        load_index(str(bad))
    assert err.value.diagnostics[0].pos.line == 3
    assert "not valid JSON" in err.value.message
    dup = tmp_path / "dup.json"
    dup.write_text('{\n  "index_version": 1,\n  "index_version": 1,\n  "models": {}\n}\n')
    with pytest.raises(InputError) as err:
        load_index(str(dup))
    assert err.value.diagnostics[0].pos.line == 3
    assert "duplicate key" in err.value.message


def test_semantic_rule_gguf_needs_one_weight_file(tmp_path: Path) -> None:
    models = {"a:b": entry("org/repo", {"a.gguf": b"1", "b.gguf": b"2"}, fmt="gguf")}
    with pytest.raises(InputError, match="exactly one .gguf"):
        load_index(str(write_index(tmp_path / "index.json", models)))


def test_unknown_name_suggests_close_names() -> None:
    index = load_index(None)
    with pytest.raises(InputError) as err:
        index.get("smollm2:1b")
    assert "smollm2:135m" in (err.value.hint or "")
    with pytest.raises(InputError) as err:
        index.get("qwen2.5:0.5b-q4")
    assert "qwen2.5:0.5b-q4_0" in (err.value.hint or "")


def test_parse_ref(tmp_path: Path) -> None:
    assert parse_ref("SmolLM2:135M") == RegistryRef("smollm2:135m")
    assert parse_ref("smollm2") == RegistryRef("smollm2:latest")
    assert parse_ref("hf:Org/Repo") == HfRef("Org/Repo", "main", None)
    assert parse_ref("hf:Org/Repo/sub/m.gguf@v1.0") == HfRef("Org/Repo", "v1.0", "sub/m.gguf")
    assert parse_ref(str(tmp_path)) == PathRef(tmp_path.resolve())
    with pytest.raises(InputError, match="malformed hub reference"):
        parse_ref("hf:just-a-name")
    with pytest.raises(InputError) as err:
        parse_ref("org/repo")
    assert err.value.hint == "for a hub repository write hf:org/repo"


def test_search_matches_names_formats_and_repos() -> None:
    index = load_index(None)
    assert {e.name for e in index.search("smollm2")} == {"smollm2:135m", "smollm2:135m-q8_0"}
    assert all(e.format == "gguf" for e in index.search("gguf"))


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_list_json_and_human(env: dict[str, str]) -> None:
    r = cli("registry", "list", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["schema_version"] == 1 and data["kind"] == "registry.list"
    assert set(REQUIRED) <= {m["name"] for m in data["models"]}
    human = cli("registry", "list")
    assert human.returncode == 0
    header, *rows = human.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "FORMAT", "QUANT"]
    assert any(row.startswith("qwen2.5:0.5b-q4_0 ") for row in rows)  # a pipe: nothing truncated


def test_cli_show_and_search(env: dict[str, str]) -> None:
    r = cli("registry", "show", "qwen2.5:0.5b-q4_0")
    assert r.returncode == 0, r.stderr
    assert "sha256:7671c0c304e6" in r.stdout and "apache-2.0" in r.stdout
    r = cli("registry", "search", "q8_0", "-f", "json")
    names = {m["name"] for m in json.loads(r.stdout)["models"]}
    assert names == {"llama3.2:1b-instruct-q8_0", "smollm2:135m-q8_0"}
    r = cli("registry", "search", "no-such-thing")
    assert r.returncode == 0 and r.stdout == "" and "no model matches" in r.stderr


def test_cli_unknown_name_exit_2_with_suggestion(env: dict[str, str]) -> None:
    r = llmir(env, "registry", "show", "smollm2:1b")  # a real process: no traceback leaks
    assert r.returncode == 2
    assert r.stdout == ""
    assert "error: unknown model 'smollm2:1b'" in r.stderr
    assert "hint: did you mean smollm2:135m" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("registry", "show", "smollm2:1b", "--format", "json")
    data = json.loads(r.stdout)
    assert data["kind"] == "error" and data["exit_code"] == 2 and "smollm2:135m" in data["hint"]


def test_cli_malformed_index_shows_line_and_caret(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_index(
        tmp_path / "index.json", {"a:b": entry("org/repo", {"model.safetensors": b"x"})}
    )
    path.write_text(path.read_text().replace('"parameters": 4096', '"parameters": -1'))
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if '"parameters"' in t)
    monkeypatch.setenv("LLMIR_REGISTRY", str(path))  # the environment variable selects the index
    r = cli("registry", "list")
    assert r.returncode == 2
    assert f"{path}:{line}:" in r.stderr and "-1 is less than 1" in r.stderr
    assert "^" in r.stderr and "hint:" in r.stderr
