"""Fixtures: a tiny random llama folder (numpy-made), its imported module and built artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmir_core.frontends.hf import import_hf

from .tiny import TINY, make_llama_folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama_folder(tmp_path_factory.mktemp("tiny") / "llama", TINY)


@pytest.fixture(scope="session")
def tiny_module(tiny_dir: Path) -> Any:
    return import_hf(tiny_dir)


@pytest.fixture(scope="session")
def tiny_artifact(tiny_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    out = tmp_path_factory.mktemp("art") / "llama"
    build_decoder(tiny_module, str(out))
    return out
