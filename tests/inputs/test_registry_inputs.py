"""The registry index and llmir.lock as a user or a broken download can leave them: nesting past
any real index, NaN, wrong types, bytes that are not UTF-8. One located line each (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmir_core.errors import InputError
from llmir_core.registry.lockfile import read_lock
from tests.inputs.helpers import invoke, rejected

INDEX_CASES = {
    "nested 100k deep": (
        "[" * 100_000 + "]" * 100_000,
        ":1:129: error: not valid JSON: nested deeper than 128 levels",
    ),
    "nested inside models": (
        '{"models": ' + "[" * 100_000 + "]" * 100_000 + "}",
        ":1:139: error: not valid JSON: nested deeper than 128 levels",
    ),
    "NaN": (
        '{"index_version": NaN, "models": {}}',
        ":1:19: error: not valid JSON: NaN is not valid JSON",
    ),
}


@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_bad_registry_index(tmp_path: Path, case: str) -> None:
    text, message = INDEX_CASES[case]
    (tmp_path / "index.json").write_text(text)
    code, out, err = invoke("registry", "list", "--registry", str(tmp_path), "--offline")
    rejected(code, err, expect=2, names=f"{tmp_path / 'index.json'}{message}")


LOCK = """lock_version = 1
[model]
ref = "smollm2:135m"
kind = "registry"
repo = "HuggingFaceTB/SmolLM2-135M"
"""

LOCK_CASES = {
    "files a float": (
        LOCK.replace("lock_version = 1", "lock_version = 1\nfiles = 1.5"),
        "[[files]] must be an array of tables",
    ),
    "nested 100k deep": (
        "a = " + "[" * 100_000 + "]" * 100_000,
        "not valid TOML: nested too deeply",
    ),
    "not UTF-8": (LOCK.replace('"smollm2:135m"', '"\udcff"'), ":3:8: not UTF-8 text (byte 0xff)"),
}


@pytest.mark.parametrize("case", list(LOCK_CASES))
def test_bad_lock(tmp_path: Path, case: str) -> None:
    text, message = LOCK_CASES[case]
    f = tmp_path / "llmir.lock"
    f.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(InputError) as info:
        read_lock(f)
    assert str(f) in info.value.message and message in info.value.message, info.value.message
