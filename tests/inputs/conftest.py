"""Fixtures: a tiny random llama folder (numpy-made), its GGUF twin and a built artifact, once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.decoder.tiny import TINY, make_llama_folder


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama_folder(tmp_path_factory.mktemp("inputs") / "llama", TINY)


@pytest.fixture(scope="session")
def llama_gguf(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf", reason="the gguf package is needed to write test files")
    from safetensors.numpy import load_file

    from tests.llm.gguf_convert import write_gguf

    out = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(llama_dir, load_file(str(llama_dir / "model.safetensors")), out)
    return out


@pytest.fixture(scope="session")
def llama_artifact(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxruntime", reason="artifacts run on onnxruntime")
    from llmir_core.frontends.hf import import_hf
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    root = tmp_path_factory.mktemp("art")
    module = import_hf(llama_dir, root / "m.llmir")
    out = root / "llama.art"
    build_decoder(module, str(out))
    return out


@pytest.fixture(scope="session")
def llama_split(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama as a 3-shard split GGUF (m-0000N-of-00003.gguf); the folder."""
    pytest.importorskip("gguf", reason="the gguf package is needed to write test files")
    from safetensors.numpy import load_file

    from tests.llm.gguf_convert import write_gguf

    out = tmp_path_factory.mktemp("split")
    state = load_file(str(llama_dir / "model.safetensors"))
    write_gguf(llama_dir, state, out / "m.gguf", split_max_tensors=7)
    return out
