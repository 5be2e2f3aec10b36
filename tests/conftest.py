"""Shared fixtures: an isolated LLMIR_HOME for every test, and a CLI runner helper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def _ext_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of compiled custom-op libraries for the session (llmir_core/backends/ort_ext):
    compiled once, not once per test's LLMIR_HOME."""
    return tmp_path_factory.mktemp("ort_ext")


@pytest.fixture(autouse=True)
def _isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, _ext_cache: Path
) -> None:
    monkeypatch.setenv("LLMIR_HOME", str(tmp_path_factory.mktemp("llmir_home")))
    monkeypatch.setenv("LLMIR_EXT_CACHE", str(_ext_cache))
    monkeypatch.setenv("NO_COLOR", "1")


def run_cli(
    *args: str,
    input: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `llmir ARGS` in a subprocess (as a user would), capturing stdout and stderr."""
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "llmir_cli.app", *args],
        capture_output=True,
        text=True,
        input=input,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )
