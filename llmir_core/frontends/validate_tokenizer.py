"""A model folder's `tokenizer.json`, checked when it is imported rather than when text first runs.

An empty file, a file that is not JSON, or JSON the `tokenizers` library cannot load would
otherwise import and build, and fail only at `llmir run --prompt`. `check_tokenizer_json` reads
the file (UTF-8 JSON: a syntax error gets `file:line:col`), checks its shape (an object with a
`model` object) and, when the `tokenizers` package is installed, loads it.
"""

from __future__ import annotations

from pathlib import Path

from llmir_core.errors import InputError
from llmir_core.fileio import read_json

_HINT = "copy the model's tokenizer.json again, or import with --no-tokenizer to build a model that takes token ids"


def check_tokenizer_json(path: Path) -> None:
    """Raise InputError (naming `path`) unless it is a loadable Hugging Face tokenizer.json."""
    value = read_json(path, hint=_HINT)
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
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # its own Exception type, or a Rust panic (a BaseException)
        said = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a valid tokenizer.json ({said})", hint=_HINT) from None
