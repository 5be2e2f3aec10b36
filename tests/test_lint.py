"""The code stays ruff-clean (lint rules and the banned imports in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


LINTED = ["llmir_core", "llmir_cli", "tests", "scripts", "benchmarks"]


def _tool(name: str) -> str:
    """The tool from the test extra, next to this interpreter or on PATH."""
    found = Path(sys.executable).parent / name
    path = str(found) if found.exists() else shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (pip install -e '.[test]')")
    return path


def test_ruff_clean() -> None:
    """Lint rules, the banned imports and the complexity bound (C901) in pyproject.toml."""
    r = subprocess.run(
        [_tool("ruff"), "check", "--no-cache", *LINTED],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_formatted() -> None:
    r = subprocess.run(
        [_tool("ruff"), "format", "--check", "--no-cache", *LINTED],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    files = sorted(
        {
            line.split("-->", 1)[1].strip().split(":", 1)[0]
            for line in r.stdout.splitlines()
            if line.strip().startswith("-->")
        }
    )
    assert r.returncode == 0, "run `ruff format .`; unformatted: " + (
        ", ".join(files) or r.stdout + r.stderr
    )


def test_mypy_clean() -> None:
    """mypy under the project's config ([tool.mypy] in pyproject.toml) over the packages."""
    r = subprocess.run(
        [_tool("mypy"), "llmir_core", "llmir_cli"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_core_never_imports_the_cli_libraries() -> None:
    """llmir_core returns data; typer and rich belong to llmir_cli only."""
    code = (
        "import sys, llmir_core.ir, llmir_core.verifier, llmir_core.interp, "
        "llmir_core.dialects.registry as r; r.all_ops(); "
        "print(sorted(m for m in ('typer', 'rich', 'torch', 'transformers', 'z3', 'triton') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
