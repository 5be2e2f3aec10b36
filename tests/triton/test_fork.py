"""`fork` on the triton target's batch decoder (a SerialBatchDecoder over TritonDecoders, their
KV rows in KVSlots buffers) equals prefilling the prompt again, as tests/decoder/test_fork.py
checks for the CPU decoders."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import import_or_skip

import_or_skip("torch", "the triton target needs torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton target needs triton (pip install 'llmir[gpu]')")

from llmir_core.targets import open_batch_artifact  # noqa: E402
from llmir_core.targets.triton.target import TARGET  # noqa: E402

from ..decoder.test_fork import fork_equals_prefill, fork_refusals  # noqa: E402
from ..decoder.tiny import TINY, make_llama_folder  # noqa: E402


def test_triton_fork_equals_prefill(tmp_path: Path) -> None:
    from llmir_core.frontends.hf import import_hf

    module = import_hf(make_llama_folder(tmp_path / "m", TINY))
    TARGET.serialize(module, str(tmp_path / "art"), arch="none", max_len=32)
    fork_equals_prefill(lambda: open_batch_artifact(str(tmp_path / "art"), 4))
    fork_refusals(open_batch_artifact(str(tmp_path / "art"), 2))
