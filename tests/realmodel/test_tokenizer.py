"""Gemma 3's tokenizer as llmir rebuilds it from the GGUF metadata gives llama.cpp's ids.

tests/data/gemma3_ids.json holds llama.cpp's ids (llama-cpp-python, written by
scripts/gen_gemma_ids.py) for varied strings: prose, code, digits, unicode and emoji, runs of
spaces and newlines, leading spaces, control-token text (parsed as the control tokens, as
llama.cpp parses a prompt and as chat templates need). Both of llmir's ways to the tokenizer
are checked: the GGUF file (`llmir tokenize FILE`, an imported module) and the tokenizer.json an
artifact carries (what `llmir run` reads).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmir_core.runtime.tokenize_src import open_tokenizer

from . import cache

DATA = Path(__file__).resolve().parent.parent / "data" / "gemma3_ids.json"
REFERENCE: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = REFERENCE["cases"]


def test_reference_is_for_this_file() -> None:
    assert REFERENCE["gguf_sha256"] == cache.SHA256
    assert len(CASES) >= 20
    assert all(c["ids"][:1] == [2] for c in CASES)  # add_bos: Gemma's <bos>


def check_encode(tok: Any) -> None:
    wrong = [
        f"{c['text']!r}: llmir {got}, llama.cpp {c['ids']}"
        for c in CASES
        if (got := tok.encode(c["text"])) != c["ids"]
    ]
    assert not wrong, f"{len(wrong)} of {len(CASES)} strings differ:\n" + "\n".join(wrong)


def test_gguf_ids_equal_llama_cpp(gemma_gguf: Path) -> None:
    """Encoding gives llama.cpp's ids; decoding them after the BOS, control tokens shown, gives
    each string back. (One test: the tokenizer takes seconds to rebuild from the metadata.)"""
    tok = open_tokenizer(str(gemma_gguf))
    check_encode(tok)
    wrong = [
        f"{c['text']!r}: {got!r}"
        for c in CASES
        if (got := tok.decode(c["ids"][1:], skip_special_tokens=False)) != c["text"]
    ]
    assert not wrong, "decode does not give back:\n" + "\n".join(wrong)


def test_artifact_ids_equal_llama_cpp(gemma_artifact: Callable[[str], Path]) -> None:
    check_encode(open_tokenizer(str(gemma_artifact("exact"))))
