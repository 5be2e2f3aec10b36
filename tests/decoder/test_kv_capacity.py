"""The KV-cache capacity rules both preallocating decoders (onnxruntime, Triton) follow."""

from __future__ import annotations

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.kv_slots import (
    DEFAULT_CAPACITY,
    check_step,
    context_limit,
    grown_capacity,
    reset_capacity,
)


def test_context_limit_is_the_smaller_known_bound() -> None:
    assert context_limit(2048, None) == 2048
    assert context_limit(None, 64) == 64
    assert context_limit(2048, 64) == 64
    assert context_limit(32, 64) == 32
    assert context_limit(None, None) is None


def test_context_limit_rejects_a_non_positive_max_context() -> None:
    with pytest.raises(InputError, match="max context must be >= 1, got 0"):
        context_limit(2048, 0)


def test_reset_and_growth() -> None:
    assert reset_capacity(None, None) == DEFAULT_CAPACITY
    assert reset_capacity(None, 100) == 100
    assert reset_capacity(40, 100) == 40
    assert grown_capacity(40, 41, None) == 80  # doubled
    assert grown_capacity(40, 200, None) == 200  # at least what the step needs
    assert grown_capacity(40, 41, 60) == 60  # never past the limit


def test_check_step_shapes_batch_and_context() -> None:
    ids = check_step(np.array([[1, 2, 3]], np.int32), 0, 0, 8)
    assert ids.dtype == np.int64 and ids.flags.c_contiguous
    with pytest.raises(InputError, match=r"input ids must be \[batch, seq\], got shape \[3\]"):
        check_step(np.array([1, 2, 3]), 0, 0, 8)
    with pytest.raises(InputError, match="batch 2 differs from the 1 the cache was reset for"):
        check_step(np.zeros((2, 1), np.int64), 1, 0, 8)
    with pytest.raises(InputError, match="9 tokens exceed the model's context of 8") as e:
        check_step(np.zeros((1, 2), np.int64), 1, 7, 8)
    assert e.value.hint and "shorter prompt" in e.value.hint
    assert check_step(np.zeros((1, 2), np.int64), 1, 6, 8).shape == (1, 2)
