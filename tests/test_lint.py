"""The code stays ruff-clean (lint rules and the banned imports in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    r = subprocess.run([ruff, "check", "--no-cache", "llmir_core", "llmir_cli", "tests", "scripts",
                        "benchmarks"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_core_never_imports_the_cli_libraries() -> None:
    """llmir_core returns data; typer and rich belong to llmir_cli only."""
    code = ("import sys, llmir_core.ir, llmir_core.verifier, llmir_core.interp, "
            "llmir_core.dialects.registry as r; r.all_ops(); "
            "print(sorted(m for m in ('typer', 'rich', 'torch', 'transformers', 'z3', 'triton') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
