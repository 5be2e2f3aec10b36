"""`llmir tokenize`: an HF folder, a vocabulary-only GGUF, an artifact and a .llmir module
tokenize alike; --format json, --no-special, --decode, --jsonl; and the errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app

tk = pytest.importorskip("tokenizers", reason="the tokenizers package is needed")


def _invoke(*args: object, stdin: str | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def vocab_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A GGUF file with a tokenizer and no tensors (as llama.cpp ships ggml-vocab-*.gguf)."""
    import gguf

    from tests.llm.gguf_convert import _add_tokenizer
    from tests.llm.test_tokenizer import byte_level_bpe, gguf_vocab

    hf = byte_level_bpe()
    path = tmp_path_factory.mktemp("vocab") / "ggml-vocab-tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    _add_tokenizer(w, gguf_vocab(hf, "gpt2", "llama-bpe"), 0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, hf


def test_sources_agree(tiny_dir: Path, tiny_artifact: Path, tmp_path: Path) -> None:
    text = "the cat sat"
    want = tk.Tokenizer.from_file(str(tiny_dir / "tokenizer.json")).encode(text).ids
    code, out, err = _invoke("import", tiny_dir, "-o", tmp_path / "m.llmir")
    assert code == 0, err
    for src in (tiny_dir, tiny_artifact, tmp_path / "m.llmir", tiny_dir / "tokenizer.json"):
        code, out, err = _invoke("tokenize", src, text)
        assert code == 0, err
        assert out.split() == [str(i) for i in want], src


def test_gguf_vocab_only(vocab_gguf: tuple[Path, Any]) -> None:
    path, hf = vocab_gguf
    text = "Hello wörld 12345"
    code, out, err = _invoke("tokenize", path, text, "--format", "json")
    assert code == 0, err
    res = json.loads(out)
    assert res["schema_version"] == 1 and res["ids"] == hf.encode(text).ids and res["ids"][0] == 0
    assert res["count"] == len(res["ids"]) and res["tokens"][0] == "<|begin|>"
    code, out, _ = _invoke("tokenize", path, text, "--no-special")
    assert [int(i) for i in out.split()] == hf.encode(text, add_special_tokens=False).ids
    ids = " ".join(str(i) for i in hf.encode(text).ids)
    code, out, _ = _invoke("tokenize", path, "--decode", ids)
    assert code == 0 and out == "<|begin|>" + text + "\n"
    code, out, _ = _invoke("tokenize", path, "--decode", ids.replace(" ", ","), "--no-special")
    assert code == 0 and out == text + "\n"
    code, out, _ = _invoke("tokenize", path, stdin=text)  # TEXT from stdin
    assert code == 0 and [int(i) for i in out.split()] == hf.encode(text).ids


def test_jsonl(vocab_gguf: tuple[Path, Any], tmp_path: Path) -> None:
    path, hf = vocab_gguf
    texts = ["first line", "second\nwith newline", "", "ünïcödé 🙂"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts))
    code, out, err = _invoke("tokenize", path, "--jsonl", tmp_path / "in.jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows == [hf.encode(t).ids for t in texts]
    (tmp_path / "ids.jsonl").write_text(out)
    code, out, err = _invoke(
        "tokenize", path, "--jsonl", tmp_path / "ids.jsonl", "--decode", "--no-special"
    )
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == texts


def test_errors(vocab_gguf: tuple[Path, Any], tiny_dir: Path, tmp_path: Path) -> None:
    path, _ = vocab_gguf
    (tmp_path / "bad.jsonl").write_text('"ok"\n{"not": "a string"}\n')
    (tmp_path / "broken.jsonl").write_text('"ok"\n"unterminated\n')
    (tmp_path / "ids.jsonl").write_text("[1, 2]\n[99999]\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.txt").write_text("x")
    cases = [
        (("tokenize", tmp_path / "nope.gguf", "x"), "no such file or folder"),
        (("tokenize", tmp_path / "empty", "x"), "no tokenizer.json in the model folder"),
        (("tokenize", tmp_path / "x.txt", "x"), "not a source with a tokenizer"),
        (("tokenize", path, "--decode", "1,a"), "'a' is not a token id"),
        (("tokenize", path, "--decode", "99999"), "token id 99999 is outside the vocabulary"),
        (
            ("tokenize", path, "--jsonl", tmp_path / "bad.jsonl"),
            "bad.jsonl:2:1: expected a JSON string",
        ),
        (("tokenize", path, "--jsonl", tmp_path / "broken.jsonl"), "broken.jsonl:2:"),
        (
            ("tokenize", path, "--jsonl", tmp_path / "ids.jsonl", "--decode"),
            "ids.jsonl:2:1: token id 99999",
        ),
        (("tokenize", path, "--jsonl", tmp_path / "missing.jsonl"), "missing.jsonl: no such file"),
        (("tokenize", path, "x", "--jsonl", tmp_path / "bad.jsonl"), "not both"),
    ]
    for args, msg in cases:
        code, out, err = _invoke(*args)
        assert code == 2 and msg in err and out == "", (args, err)
