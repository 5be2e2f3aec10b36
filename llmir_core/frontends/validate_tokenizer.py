"""A model folder's `tokenizer.json`, checked when it is imported rather than when text first runs.

An empty file, a file that is not JSON, or JSON the `tokenizers` library cannot load would
otherwise import and build, and fail only at `llmir run --prompt`. `check_tokenizer_json` reads
the file (UTF-8 JSON: a syntax error gets `file:line:col`), checks its shape (an object with a
`model` object) and, when the `tokenizers` package is installed, loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmir_core.errors import InputError

_HINT = "copy the model's tokenizer.json again, or import with --no-tokenizer to build a model that takes token ids"


def read_json_located(path: Path, what: str = "JSON") -> Any:
    """A JSON file's value; a read, decode or syntax error names `path` (and line:col)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(
            f"{path}:{line}:{col}: not UTF-8 text (byte {data[exc.start]:#04x})", hint=_HINT
        ) from None
    if not text.strip():
        raise InputError(f"{path}: empty file, expected {what}", hint=_HINT)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})", hint=_HINT
        ) from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply", hint=_HINT) from None


def check_tokenizer_json(path: Path) -> None:
    """Raise InputError (naming `path`) unless it is a loadable Hugging Face tokenizer.json."""
    value = read_json_located(path, "a tokenizer.json object")
    if not isinstance(value, dict):
        raise InputError(f"{path}: must be a JSON object, got {type(value).__name__}", hint=_HINT)
    model = value.get("model")
    if not isinstance(model, dict):
        raise InputError(
            f"{path}: field 'model' must be an object (the tokenizer's vocabulary)", hint=_HINT
        )
    try:
        import tokenizers
    except ImportError:
        return  # the shape is all that can be checked without the library
    try:
        tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type
        said = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a valid tokenizer.json ({said})", hint=_HINT) from None
