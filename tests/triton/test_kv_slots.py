"""The triton runner's KV buffers through the shared KV-slot module: a decoder that starts with
2 rows and grows while it decodes gives the logits of one reserved for the whole sequence."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import import_or_skip

import_or_skip("torch", "the triton target needs torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton target needs triton (pip install 'llmir[gpu]')")

from llmir_core.targets.triton.target import TARGET  # noqa: E402

from ..decoder.test_kv_slots import _greedy  # noqa: E402
from ..decoder.tiny import TINY, make_llama_folder  # noqa: E402


def test_the_triton_runner_grows_its_buffers_keeping_the_rows(tmp_path: Path) -> None:
    from llmir_core.frontends.hf import import_hf

    module = import_hf(make_llama_folder(tmp_path / "m", TINY))
    TARGET.serialize(module, str(tmp_path / "art"), arch="none")
    prompt = [1, 40, 17]
    roomy = _greedy(TARGET.open(str(tmp_path / "art")), prompt, 3, reserve=64)
    dec = TARGET.open(str(tmp_path / "art"))
    tight = _greedy(dec, prompt, 3, reserve=2)  # 2 rows -> 4 (the prompt: doubled) -> 8
    assert dec.capacity == 8 and dec.length == len(prompt) + 3
    for a, b in zip(roomy, tight):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_the_triton_target_serves_through_a_serial_batch(tmp_path: Path) -> None:
    """open_batch: one TritonDecoder per slot (no batched triton runner yet), through the table."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.runtime.batch_decoder import SerialBatchDecoder
    from llmir_core.targets import open_batch_artifact

    module = import_hf(make_llama_folder(tmp_path / "m", TINY))
    TARGET.serialize(module, str(tmp_path / "art"), arch="none", max_len=32)
    batch = open_batch_artifact(str(tmp_path / "art"), 2)
    assert isinstance(batch, SerialBatchDecoder) and batch.slots == 2
    assert batch.max_context == 32 and batch.vocab == TINY.vocab
    one = TARGET.open(str(tmp_path / "art"))
    one.reset(1)
    want = one.forward(np.asarray([[1, 40, 17]]))[0, -1]
    np.testing.assert_allclose(batch.prefill(1, [1, 40, 17], 0), want, rtol=1e-5, atol=1e-5)
    step = one.forward(np.asarray([[5]]))[0, -1]
    np.testing.assert_allclose(batch.decode([1], [5], [3])[0], step, rtol=1e-5, atol=1e-5)
