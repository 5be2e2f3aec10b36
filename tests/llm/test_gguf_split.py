"""Split GGUF (`NAME-00001-of-0000N.gguf`): every shard imported, weights referenced per shard."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.gguf import import_gguf

from .tiny import VOCAB, check_against_full_forward, ir_greedy

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to write test files")


@pytest.fixture()
def split_model(tiny_model: Any, tmp_path: Path) -> tuple[Path, Any]:
    from .gguf_convert import load_reference, model_state, write_gguf

    folder, model = tiny_model("llama")
    ref = write_gguf(folder, model_state(model), tmp_path / "m.gguf", "Q8_0", split_max_tensors=7)
    twin = copy.deepcopy(model)
    load_reference(twin, ref)
    return tmp_path, twin


def test_split_parity_and_per_shard_references(split_model: tuple[Path, Any]) -> None:
    d, ref = split_model
    shards = sorted(p.name for p in d.glob("m-*-of-*.gguf"))
    assert len(shards) >= 3 and shards[0] == f"m-00001-of-{len(shards):05d}.gguf"
    module = import_gguf(d / shards[0], out_path=d / "m.llmir")
    files = {op.attrs["file"] for op in module.main.ops if op.name == "core.weight"}
    assert files == set(shards)  # each weight names its own shard
    assert module.attrs["llm.tokenizer"]["file"] == shards[0]
    p = np.random.default_rng(2).integers(3, VOCAB, (1, 7))
    logits, tokens = ir_greedy(module, p, 8)
    assert max(check_against_full_forward(ref, p, logits, tokens)) <= 1e-4


def test_split_errors(split_model: tuple[Path, Any], tmp_path: Path) -> None:
    d, _ = split_model
    shards = sorted(d.glob("m-*-of-*.gguf"))
    n = len(shards)
    with pytest.raises(
        InputError, match=rf"is shard 2 of {n}; the model's metadata is in the first shard"
    ):
        import_gguf(shards[1])
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(shards[0], other / shards[0].name)
    with pytest.raises(InputError, match=rf"m-00002-of-{n:05d}\.gguf: shard 2 of {n} is missing"):
        import_gguf(other / shards[0].name)
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(shards[0], renamed)
    with pytest.raises(InputError, match=r"the file name does not end in -NNNNN-of-NNNNN\.gguf"):
        import_gguf(renamed)
    # a shard from elsewhere in the place of shard 2
    shutil.copy(shards[0], other / shards[1].name)
    for s in shards[2:]:
        shutil.copy(s, other / s.name)
    with pytest.raises(InputError, match=rf"says shard 1 of {n}, expected shard 2 of {n}"):
        import_gguf(other / shards[0].name)
