"""Structured outputs on the real file: llmir's token bytes for Gemma 3's 262144 tokens are
llguidance's own reading of the same tokenizer.json, and `llmir run ART --json-schema s.json`
prints JSON that validates against s.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmir_core.runtime.grammar import token_bytes
from llmir_core.runtime.textgen import load_artifact_tokenizer
from llmir_core.targets import read_manifest

llguidance = pytest.importorskip("llguidance", reason="llguidance is not installed")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


def test_token_bytes_equal_llguidance_reading(gemma_artifact: Callable[[str], Path]) -> None:
    art = str(gemma_artifact("exact"))
    tok = load_artifact_tokenizer(art, read_manifest(art))
    ours, special = token_bytes(tok, tok.vocab_size)
    native = llguidance.LLTokenizer(
        tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=list(tok.eos_ids)
    )
    skip = set(special)
    wrong = [
        i for i in range(tok.vocab_size) if i not in skip and native.decode_bytes([i]) != ours[i]
    ]
    assert not wrong, [(i, ours[i], native.decode_bytes([i])) for i in wrong[:5]]


def test_run_json_schema_validates(
    gemma_artifact: Callable[[str], Path], llmir_cli: Callable[..., str], tmp_path: Path
) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    out = llmir_cli(
        "run",
        str(gemma_artifact("exact")),
        "-p",
        "A person, as JSON:",
        "--json-schema",
        str(schema),
        "-n",
        "96",
        "--format",
        "json",
    )
    [res] = json.loads(out)["results"]
    value = json.loads(res["text"])
    assert res["stop_reason"] == "eos" and set(value) == set(SCHEMA["properties"])
    assert isinstance(value["name"], str) and len(value["name"]) <= 20
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 120
    assert set(value["pets"]) <= {"cat", "dog", "fish"} and len(value["pets"]) <= 3
