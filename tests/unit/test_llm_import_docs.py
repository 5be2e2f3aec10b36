"""docs/llm-import.md's support tables are generated from the importers' tables and up to date."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmir_core.frontends import support

PAGE = Path(__file__).resolve().parents[2] / "docs" / "llm-import.md"


def test_page_matches_code() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert support.splice(page, support.support_markdown()) == page, (
        "docs/llm-import.md is out of date: run python scripts/gen_llm_import_docs.py"
    )


def test_every_supported_thing_is_listed() -> None:
    from llmir_core.frontends.gguf import ARCHITECTURES as GGUF_ARCHS
    from llmir_core.frontends.hf import ARCHITECTURES as HF_ARCHS
    from llmir_core.frontends.rope import ROPE_TYPES
    from llmir_core.runtime.pretokenize import PRE_NAMES

    text = support.support_markdown()
    for name in [*HF_ARCHS, *GGUF_ARCHS, *ROPE_TYPES, *PRE_NAMES]:
        assert f"`{name}`" in text, name


def test_new_architecture_needs_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(support.ARCH_NOTES, "qwen3")
    with pytest.raises(ValueError, match=r"ARCH_NOTES has no line for architecture\(s\) qwen3"):
        support.support_markdown()


def test_page_without_markers() -> None:
    with pytest.raises(ValueError, match="no GENERATED markers"):
        support.splice("# a page\n", "body")
