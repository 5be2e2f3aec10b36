"""Fixtures for the LLM frontend tests: tiny transformers models, made once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Any]]:
    """`tiny_model(arch)` -> (folder with config.json + model.safetensors, the torch model)."""
    pytest.importorskip("torch", reason="torch is a test-only extra (pip install torch)")
    pytest.importorskip(
        "transformers", reason="transformers is a test-only extra (pip install transformers)"
    )
    from .tiny import make_model

    root = tmp_path_factory.mktemp("tiny_models")
    made: dict[str, tuple[Path, Any]] = {}

    def get(arch: str) -> tuple[Path, Any]:
        if arch not in made:
            folder = root / arch
            made[arch] = (folder, make_model(arch, folder))
        return made[arch]

    return get
