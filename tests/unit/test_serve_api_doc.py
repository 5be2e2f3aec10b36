"""docs/serve-api.md is generated from llmir_core/serve/params.py (scripts/gen_serve_api_docs.py):
the committed file matches a fresh render and lists every field of both endpoints with its
status."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from llmir_core.serve.params import ENDPOINTS, PATHS, table

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "serve-api.md"


def _script():  # scripts/ is not a package: load the script as a module
    path = REPO / "scripts" / "gen_serve_api_docs.py"
    spec = importlib.util.spec_from_file_location("gen_serve_api_docs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serve_api_doc_is_fresh() -> None:
    current = DOC.read_text(encoding="utf-8")
    assert current == _script().render(), (
        "docs/serve-api.md is stale: run `python scripts/gen_serve_api_docs.py`"
    )


def test_serve_api_doc_lists_every_field_with_its_status() -> None:
    text = DOC.read_text(encoding="utf-8")
    for endpoint in ENDPOINTS:
        part = text.split(f"## `POST {PATHS[endpoint]}`", 1)[1].split("\n## ", 1)[0]
        for p in table(endpoint).values():
            words = {"honored": "| honored |", "noop": "| no-op |", "refused": "| refused"}
            line = next((ln for ln in part.splitlines() if ln.startswith(f"| `{p.name}`")), "")
            assert words[p.status] in line, f"{endpoint} {p.name}: {line!r}"
