"""The tokenizer of any source llmir reads, for `llmir tokenize`.

`open_tokenizer(src)` accepts a Hugging Face model folder (its `tokenizer.json`), a GGUF file
(a whole model, or a vocabulary-only file with no tensors, as llama.cpp ships for its tokenizer
tests), an artifact folder from `llmir build` (`manifest.json` + `tokenizer.json`) or an imported
`.llmir` module (the tokenizer its `llm.tokenizer` attribute names). `encode_lines` /
`decode_lines` are the `--jsonl` forms: one JSON string (or id array) per line in, one JSON id
array (or string) per line out, in the same order; a bad line is an error naming its line number.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

from llmir_core.errors import InputError
from llmir_core.fileio import read_text

from .tokenizer import Tokenizer, from_gguf_metadata, from_hf_file, load_tokenizer


def _hf_folder(folder: str) -> Tokenizer:
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise InputError(
            f"{folder}: no tokenizer.json in the model folder",
            hint="a folder saved by transformers holds one (tokenizer.model alone is not read)",
        )
    return Tokenizer(from_hf_file(path))


def _artifact(folder: str) -> Tokenizer:
    from llmir_core.artifact_check import read_manifest

    from .textgen import load_artifact_tokenizer

    manifest = read_manifest(folder)  # validated against the manifest schema
    if not isinstance(manifest.get("decoder"), dict):
        raise InputError(
            f"{folder}: the artifact is not a decoder (its manifest has no decoder section), "
            "so it has no tokenizer"
        )
    return load_artifact_tokenizer(folder, manifest)


def _gguf(path: str) -> Tokenizer:
    from llmir_core.frontends.gguf import GGUFFile, _check_tokenizer, read_tokenizer

    from .pretokenize import special_tokens

    g = GGUFFile(path)
    _check_tokenizer(g)
    meta = read_tokenizer(path, g)
    st = special_tokens(meta)
    return Tokenizer(from_gguf_metadata(meta), st.bos_id, st.eog_ids, meta.get("chat_template"))


def _llmir(path: str) -> Tokenizer:
    from llmir_core.ir.parser import parse_module

    module = parse_module(read_text(path), path)
    module.source = os.path.abspath(path)
    return load_tokenizer(module)


def open_tokenizer(src: str) -> Tokenizer:
    """The tokenizer of an HF folder, GGUF file, artifact folder or .llmir module."""
    if not os.path.exists(src):
        raise InputError(
            f"{src}: no such file or folder", hint="pass a model folder, .gguf, artifact or .llmir"
        )
    if os.path.isdir(src):
        if os.path.isfile(os.path.join(src, "manifest.json")):
            return _artifact(src)
        return _hf_folder(src)
    lower = src.lower()
    if lower.endswith(".gguf"):
        return _gguf(src)
    if lower.endswith(".llmir"):
        return _llmir(src)
    if os.path.basename(lower) == "tokenizer.json":
        return Tokenizer(from_hf_file(src))
    raise InputError(
        f"{src}: not a source with a tokenizer",
        hint="pass a Hugging Face model folder, a .gguf file, an artifact folder or a .llmir file",
    )


def parse_ids(text: str, where: str = "ids") -> list[int]:
    """'1 2 3', '1,2,3' or '[1, 2, 3]' -> [1, 2, 3]."""
    items = [t for t in re.split(r"[\s,\[\]]+", text.strip()) if t]
    bad = next((t for t in items if not re.fullmatch(r"\d+", t)), None)
    if bad is not None:
        raise InputError(f"{where}: '{bad}' is not a token id (a non-negative integer)")
    return [int(t) for t in items]


def check_ids(tok: Tokenizer, ids: list[int], where: str) -> None:
    n = tok.vocab_size
    bad = next((i for i in ids if i >= n), None)
    if bad is not None:
        raise InputError(f"{where}: token id {bad} is outside the vocabulary (0..{n - 1})")


def _json_lines(lines: Iterable[str], path: str) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            raise InputError(f"{path}:{n}:1: empty line (one JSON value per line)")
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{n}:{exc.colno}: not valid JSON ({exc.msg})") from None


def encode_lines(
    tok: Tokenizer, lines: Iterable[str], path: str, add_special: bool
) -> list[list[int]]:
    """One JSON string per line -> one id list per line (all lines checked before any output)."""
    out = []
    for n, value in _json_lines(lines, path):
        if not isinstance(value, str):
            raise InputError(f"{path}:{n}:1: expected a JSON string, got {type(value).__name__}")
        out.append(tok.encode(value, add_special_tokens=add_special))
    return out


def decode_lines(tok: Tokenizer, lines: Iterable[str], path: str, skip_special: bool) -> list[str]:
    """One JSON id array per line -> one string per line."""
    out = []
    for n, value in _json_lines(lines, path):
        if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
        ):
            raise InputError(f"{path}:{n}:1: expected a JSON array of token ids")
        check_ids(tok, value, f"{path}:{n}:1")
        out.append(tok.decode(value, skip_special_tokens=skip_special))
    return out


__all__ = ["open_tokenizer", "parse_ids", "check_ids", "encode_lines", "decode_lines"]
