"""lower-triton keeps the reference semantics: the tiny decoder before and after lowering gives
the same logits in the reference interpreter (the triton ops declare the lowered ops' semantics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmir_core.interp import run
from llmir_core.passes import PASSES
from llmir_core.passes.base import PassContext, clone_module
from llmir_core.verifier import verify

from ..decoder.tiny import TINY, make_llama_folder


@pytest.fixture(scope="module")
def tiny_module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from llmir_core.frontends.hf import import_hf

    return import_hf(make_llama_folder(tmp_path_factory.mktemp("tiny") / "llama", TINY))


def _feeds(seq: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, TINY.vocab, (1, seq)),
        "positions": np.arange(past, past + seq, dtype=np.int64)[None],
    }
    d = TINY.hidden // TINY.heads
    for i in range(TINY.layers):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal(
                (1, TINY.kv_heads, past, d)
            ).astype(np.float32)
    return feeds


@pytest.mark.parametrize("kv_cache", ["native", "int8"])
def test_lowered_decoder_matches(tiny_module, kv_cache: str) -> None:  # type: ignore[no-untyped-def]
    lowered = clone_module(tiny_module)
    assert PASSES["lower-triton"](kv_cache=kv_cache).run(lowered, PassContext())
    assert not [d for d in verify(lowered) if d.severity == "error"]
    names = {op.name for op in lowered.main.ops}
    assert {"triton.attention", "triton.kv_append", "triton.gated_matmul", "triton.rotary"} <= names
    assert not {n for n in names if n.startswith("llm.")}
    feeds = _feeds(3, 4)
    want, got = run(tiny_module, feeds), run(lowered, feeds)
    tol = 1e-5 if kv_cache == "native" else 5e-2
    np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol)
    np.testing.assert_array_equal(
        got[1][:, :, :4], want[1][:, :, :4]
    )  # past rows kept as they were


def test_lowering_is_idempotent(tiny_module, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lowered = clone_module(tiny_module)
    PASSES["lower-triton"]().run(lowered, PassContext())
    assert not PASSES["lower-triton"]().run(lowered, PassContext())
