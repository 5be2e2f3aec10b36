"""Numbers in docs come from files (issue 21): every generated block in README.md and docs/*.md
matches what scripts/gen_doc_numbers.py renders from its results file, and every other figure
sits in a block that names its source. The convention is at the top of docs/perf.md."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gen() -> ModuleType:  # scripts/ is not a package: load the script as a module
    spec = importlib.util.spec_from_file_location(
        "gen_doc_numbers", REPO / "scripts" / "gen_doc_numbers.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_numbers_are_generated_and_sourced(gen: ModuleType) -> None:
    found = gen.check()
    assert not found, "\n".join(found) + "\nrun python scripts/gen_doc_numbers.py"


def test_every_renderer_is_used_and_its_source_exists(gen: ModuleType) -> None:
    text = "".join(p.read_text() for p in gen.doc_files())
    used = {m["name"] for m in gen.GEN.finditer(text)}
    assert used == set(gen.RENDERERS), set(gen.RENDERERS) ^ used
    for m in gen.GEN.finditer(text):
        assert (REPO / m["src"]).is_file(), m["src"]


def test_a_number_edited_by_hand_is_caught(gen: ModuleType) -> None:
    text = (REPO / "README.md").read_text()
    block = next(m for m in gen.GEN.finditer(text) if m["name"] == "vs-peers-headline")
    body = block["body"]
    first = re.search(r"\d\.\d\dx", body)
    assert first, body
    edited_number = "9.99x" if first.group(0) != "9.99x" else "8.88x"
    edited = text.replace(body, body.replace(first.group(0), edited_number, 1))
    assert any("out of date" in p for p in gen.problems_in("README.md", edited))
    # the op count comes from the registry
    op_count = re.sub(r"\d+ ops", "93 ops", text, count=1)
    assert any("gen:op-count is out of date" in p for p in gen.problems_in("README.md", op_count))


def test_a_figure_needs_a_named_source(gen: ModuleType) -> None:
    bare = "# t\n\nllmir decodes at 1.23x the peer's speed.\n"
    assert any("1.23x without a named source" in p for p in gen.problems_in("docs/x.md", bare))
    for ok in (
        "# t\n\n<!-- from: benchmarks/results/cpu_vs_peers.json -->\nllmir decodes at 1.23x.\n",
        "# t\n\nFrom `benchmarks/results/cpu_vs_peers.json`: llmir decodes at 1.23x.\n",
        "# t\n\nShapes are not figures: 576x1536, `?b x 64 x f32`, `--threads 2`.\n",
    ):
        assert gen.problems_in("docs/x.md", ok) == [], ok
    # a named file must exist, and a source in another paragraph does not count
    missing = "# t\n\n<!-- from: benchmarks/results/nope.json -->\nat 1.23x.\n"
    assert any("nope.json, which does not exist" in p for p in gen.problems_in("x.md", missing))
    apart = "<!-- from: benchmarks/results/cpu_vs_peers.json -->\n\nat 1.23x.\n"
    assert gen.problems_in("docs/x.md", apart)


def test_a_stale_or_unknown_block_is_caught(gen: ModuleType) -> None:
    unknown = "<!-- gen:nope from: benchmarks/results/cpu_vs_peers.json -->x<!-- /gen:nope -->"
    assert any("unknown generated block" in p for p in gen.problems_in("docs/x.md", unknown))
    wrong_src = (
        "<!-- gen:op-count from: benchmarks/results/cpu_vs_peers.json -->1<!-- /gen:op-count -->"
    )
    assert any("its source is" in p for p in gen.problems_in("docs/x.md", wrong_src))
