# ruff: noqa: F811  (pytest fixtures imported from tests/decoder)
"""`llmir run ART --json-schema FILE` / `--grammar FILE` on the tiny random-weights artifact: its
text is JSON (or the grammar's language) only because the mask allows nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.decoder.conftest import tiny_artifact, tiny_dir, tiny_module  # noqa: F401  (fixtures)
from tests.decoder.reference_fixtures import invoke

pytest.importorskip("llguidance", reason="llguidance is not installed")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 50},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}


def run_json(art: Path, *args: object) -> list[dict[str, object]]:
    code, out, err = invoke("run", art, "--format", "json", "-n", "120", *args)
    assert code == 0, err
    return json.loads(out)["results"]  # type: ignore[no-any-return]


def test_run_json_schema_output_validates(tiny_artifact: Path, tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    for seed in (0, 1, 2):
        [res] = run_json(
            tiny_artifact,
            "--prompt",
            "hi",
            "--json-schema",
            schema,
            "--temperature",
            "1",
            "--seed",
            seed,
        )
        assert res["stop_reason"] == "eos", res
        value = json.loads(str(res["text"]))
        assert set(value) == {"name", "n", "tags"} and 0 <= value["n"] <= 50
        assert len(value["name"]) <= 6 and 1 <= len(value["tags"]) <= 3
        assert set(value["tags"]) <= {"a", "b"}


def test_run_grammar_lark_and_gbnf(tiny_artifact: Path, tmp_path: Path) -> None:
    lark = tmp_path / "g.lark"
    lark.write_text('start: "yes" | "no" | NUM\nNUM: /[0-9]{2}/\n')
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= ("up" | "down") " " [0-9]\n')
    for seed in (0, 1, 2):
        [a] = run_json(
            tiny_artifact, "-p", "x", "--grammar", lark, "--temperature", "1", "--seed", seed
        )
        assert a["text"] in ("yes", "no") or (len(str(a["text"])) == 2 and str(a["text"]).isdigit())
        [b] = run_json(
            tiny_artifact, "-p", "x", "--grammar", gbnf, "--temperature", "1", "--seed", seed
        )
        word, digit = str(b["text"]).split(" ")
        assert word in ("up", "down") and digit.isdigit() and len(digit) == 1


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "bad.json",
            '{"type": "object", "if": {}}',
            "bad.json: this JSON Schema cannot be enforced: ",
        ),
        ("bad.json", '{"type": ', "bad.json:1:"),
        ("bad.json", "[1, 2]", "bad.json: a JSON Schema must be a JSON object"),
        ("bad.lark", "start: foo(", "bad.lark: this Lark grammar is not valid: "),
        ("bad.gbnf", "root ::= (", "bad.gbnf: not a valid GBNF grammar"),
    ],
)
def test_bad_grammar_file_is_one_line(
    tiny_artifact: Path,
    tmp_path: Path,
    name: str,
    text: str,
    message: str,
) -> None:
    path = tmp_path / name
    path.write_text(text)
    option = "--json-schema" if name.endswith(".json") else "--grammar"
    code, out, err = invoke("run", tiny_artifact, "-p", "x", option, path)
    assert code == 2, err
    first = err.strip().splitlines()[0]
    assert first.startswith("error: " + str(tmp_path)) and message in first, err
    assert "Traceback" not in err and out == ""


def test_grammar_options_need_text_generation(tiny_artifact: Path, tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text("{}")
    code, _, err = invoke("run", tiny_artifact, "--prompt-ids", "1,2", "--json-schema", schema)
    assert code == 2 and "--json-schema / --grammar constrain generated text" in err
    code, _, err = invoke(
        "run", tiny_artifact, "-p", "x", "--json-schema", schema, "--grammar", schema
    )
    assert code == 2 and "give one" in err
    code, _, err = invoke("run", tiny_artifact, "-p", "x", "--json-schema", tmp_path / "none.json")
    assert code == 2 and "none.json: no such file" in err


def test_run_output_cut_before_the_grammar_ends_fails(tiny_artifact: Path, tmp_path: Path) -> None:
    """--max-new-tokens too small for the schema: the text is not valid JSON, and run says so
    (a warning, `grammar_complete: false`, exit 1), never passing it off as the answer."""
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    code, out, err = invoke(
        "run", tiny_artifact, "--format", "json", "-n", "3", "-p", "hi", "--json-schema", schema
    )
    assert code == 1, err
    body = json.loads(out)
    [res] = body["results"]
    assert body["ok"] is False and res["grammar_complete"] is False
    assert (
        res["stop_reason"] == "length" and "before the grammar was complete" in res["warnings"][0]
    )
    code, out, err = invoke("run", tiny_artifact, "-n", "3", "-p", "hi", "--json-schema", schema)
    assert code == 1 and "warning: the output stopped (length)" in err
    assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err
    [whole] = run_json(tiny_artifact, "--prompt", "hi", "--json-schema", schema)
    assert whole["grammar_complete"] is True
