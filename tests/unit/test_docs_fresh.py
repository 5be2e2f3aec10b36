"""docs/spec.md is generated (scripts/gen_docs.py): the committed file must match a fresh render."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _gen_docs():  # scripts/ is not a package: load the script as a module
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spec_is_fresh() -> None:
    fresh = _gen_docs().render()
    current = (REPO / "docs" / "spec.md").read_text(encoding="utf-8")
    assert current == fresh, "docs/spec.md is stale: run `python scripts/gen_docs.py`"


def test_spec_documents_every_op() -> None:
    from llmir_core.dialects.registry import all_ops

    text = (REPO / "docs" / "spec.md").read_text(encoding="utf-8")
    missing = [n for n in all_ops() if f"#### `{n}`" not in text]
    assert not missing, f"not in docs/spec.md: {missing}; run `python scripts/gen_docs.py`"
