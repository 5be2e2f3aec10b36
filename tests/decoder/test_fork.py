"""`BatchDecoder.fork(src, dsts, length)` on every batch decoder that runs on the CPU: a slot
given a prompt's KV rows by fork computes, from then on, the logits it would compute had it
prefilled the prompt itself, bitwise (the same kernels on the same rows). The triton runner's
case is tests/triton/test_fork.py (it needs Triton's interpreter set up first)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.batch_decoder import BatchDecoder, SerialBatchDecoder
from llmir_core.targets import get_target
from llmir_core.targets.onnxruntime.batch_runner import OrtBatchDecoder
from llmir_core.targets.onnxruntime.native import unavailable_reason
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .reference_fixtures import ref_artifact, tiny_llmir  # noqa: F401  (fixtures)

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")

PROMPT = [1, 40, 17, 5, 9, 23, 61, 2, 77, 30]
OTHER = [1, 3, 3, 90, 12, 8, 44, 51, 6, 70, 71, 72, 73, 74]  # a longer sequence before


def _prefill(dec: BatchDecoder, slot: int) -> np.ndarray:
    """PROMPT in two chunks (a fork of the first chunk's rows then equals its prefill bitwise:
    the rows were computed by the same forward)."""
    dec.prefill(slot, PROMPT[:6], 0)
    return dec.prefill(slot, PROMPT[6:], 6)


def fork_equals_prefill(open_batch: Callable[[], BatchDecoder]) -> None:
    """Slot 0 prefills PROMPT and forks it into slots 1 and 2 (slot 2 held a longer sequence
    before); a second decoder prefills PROMPT in each slot itself. Two decode steps with
    different tokens per slot, then a fork of a prefix continued by another chunk: the logits
    are equal bitwise."""
    n = len(PROMPT)
    forked, alone = open_batch(), open_batch()
    forked.prefill(2, OTHER, 0)
    first = _prefill(forked, 0)
    forked.fork(0, [1, 2], n)
    for slot in (0, 1, 2):
        np.testing.assert_array_equal(_prefill(alone, slot), first)
    for step, toks in enumerate(([3, 7, 11], [4, 4, 100])):
        got = forked.decode([0, 1, 2], toks, [n + step] * 3)
        want = alone.decode([0, 1, 2], toks, [n + step] * 3)
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got[0], got[2])  # the slots went on independently
    forked.fork(0, [3], 6)  # a prefix of what slot 0 holds
    alone.prefill(3, PROMPT[:6], 0)
    np.testing.assert_array_equal(forked.prefill(3, [50, 51], 6), alone.prefill(3, [50, 51], 6))


def fork_refusals(dec: BatchDecoder) -> None:
    dec.prefill(0, PROMPT, 0)
    with pytest.raises(InputError, match="cannot fork"):
        dec.fork(0, [0, 1], 3)
    with pytest.raises(InputError, match="cannot fork"):
        dec.fork(0, [dec.slots], 3)
    with pytest.raises(InputError, match=f"cannot fork {len(PROMPT) + 1} rows of slot 0"):
        dec.fork(0, [1], len(PROMPT) + 1)


@needs_kernel
def test_ort_batch_fork_equals_prefill(tiny_artifact: Path) -> None:
    fork_equals_prefill(lambda: OrtBatchDecoder(str(tiny_artifact), 4, threads=1, max_context=64))
    fork_refusals(OrtBatchDecoder(str(tiny_artifact), 2, threads=1, max_context=64))


def test_ort_attention_fork_equals_prefill(tiny_module: Any, tmp_path: Path) -> None:
    """onnxruntime's own attention: decode steps bind rows [0, max slot] (no mixed steps)."""
    from llmir_core.targets import build

    art = tmp_path / "ort"
    build(tiny_module, str(art), "onnxruntime", options={"attention_kernel": "onnxruntime"})
    fork_equals_prefill(lambda: OrtBatchDecoder(str(art), 4, threads=1, max_context=64))


@needs_kernel
def test_ort_fork_keeps_the_kv_touched_accounting(tiny_artifact: Path) -> None:
    forked = OrtBatchDecoder(str(tiny_artifact), 4, threads=1, max_context=64)
    alone = OrtBatchDecoder(str(tiny_artifact), 4, threads=1, max_context=64)
    forked.prefill(0, PROMPT, 0)
    forked.fork(0, [1, 3], len(PROMPT))
    for slot in (0, 1, 3):
        alone.prefill(slot, PROMPT, 0)
    assert forked.kv_touched_bytes == alone.kv_touched_bytes > 0
    assert forked.kv_usage.high == [len(PROMPT), len(PROMPT), 0, len(PROMPT)]


@needs_kernel
def test_serial_ort_fork_equals_prefill(tiny_artifact: Path) -> None:
    """SerialBatchDecoder over single-sequence onnxruntime decoders (shared KV buffers)."""
    fork_equals_prefill(
        lambda: SerialBatchDecoder(lambda: open_decoder(str(tiny_artifact), 1), 4, 128, 64)
    )
    fork_refusals(SerialBatchDecoder(lambda: open_decoder(str(tiny_artifact), 1), 2, 128, 64))


def test_reference_fork_equals_prefill(ref_artifact: Path) -> None:  # noqa: F811
    target = get_target("reference")
    fork_equals_prefill(lambda: target.open_batch(str(ref_artifact), 4, max_context=64))
    fork_refusals(target.open_batch(str(ref_artifact), 2, max_context=64))
