"""Shared fixtures: an isolated LLMIR_HOME for every test, a CLI runner helper, and the one rule
for a test whose precondition is missing (skip_or_fail: a skip with its reason, a failure under
CI=true, where the claims the test backs must be checked)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def skip_or_fail(reason: str, *, module_level: bool = False) -> NoReturn:
    """Skip the test with `reason`; under CI=true fail instead (a kernel or browser test that
    cannot run there leaves a claim unchecked)."""
    if under_ci():
        pytest.fail(f"CI=true: this test must run, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def import_or_skip(name: str, reason: str) -> ModuleType:
    """`pytest.importorskip` that fails under CI=true (usable at module level)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        skip_or_fail(reason, module_level=True)


def requires(reason: str | None) -> pytest.MarkDecorator:
    """A mark: the test needs a precondition, unmet when `reason` is not None (then the test is
    skipped with it, or fails under CI=true: see pytest_runtest_setup)."""
    return pytest.mark.requires(reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(reason): a precondition (None: met)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        if mark.args and mark.args[0] is not None:
            skip_or_fail(str(mark.args[0]))


@pytest.fixture(scope="session")
def _ext_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of compiled custom-op libraries for the session (llmir_core/targets/onnxruntime/native):
    compiled once, not once per test's LLMIR_HOME. A LLMIR_EXT_CACHE set before the session is
    kept (scripts/mutate_kernels.py compiles each mutant's library there first); the library's
    name carries its sources' digest, so a shared folder never serves another source's build."""
    preset = os.environ.get("LLMIR_EXT_CACHE")
    return Path(preset) if preset else tmp_path_factory.mktemp("ort_ext")


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
