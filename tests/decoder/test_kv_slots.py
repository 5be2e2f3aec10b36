"""The one KV-slot module (llmir_core.runtime.kv_slots) and the onnxruntime runner's use of it:
reserve sizes the reset, grow keeps the rows written so far, reset reuses what fits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.kv_slots import DEFAULT_CAPACITY, KVSlots


def _slots(limit: int | None = 64) -> tuple[KVSlots, list[tuple[int, int]]]:
    made: list[tuple[int, int]] = []

    def make(batch: int, capacity: int) -> list[object]:
        made.append((batch, capacity))
        return [
            np.zeros((batch, 2, capacity, 3), np.float32),
            (np.zeros((batch, 2, capacity, 3), np.int8), np.ones((batch, 2, capacity))),
            (np.zeros((batch, 2, capacity, 3), np.float32), None),
        ]

    return KVSlots(limit, make), made


def test_reserve_sizes_the_reset_and_a_fitting_reset_reuses_the_buffers() -> None:
    kv, made = _slots()
    kv.reset(1)
    assert DEFAULT_CAPACITY > 64 and made == [(1, 64)]
    kv.reserve(10)
    kv.reset(1)  # 10 rows fit in what is there: no new buffers
    assert len(made) == 1 and kv.length == 0 and kv.batch == 1
    kv.reset(2)  # another batch: new buffers
    assert made[-1] == (2, 10)
    kv.reserve(1000)
    kv.reset(2)
    assert made[-1] == (2, 64)  # capped at the limit
    with pytest.raises(InputError, match="batch must be >= 1"):
        kv.reset(0)


def test_grow_keeps_the_rows_written_so_far() -> None:
    kv, made = _slots(limit=20)
    kv.reserve(4)
    kv.reset(1)
    rows = np.arange(1 * 2 * 3 * 3, dtype=np.float32).reshape(1, 2, 3, 3) + 1
    kv.buffers[0][:, :, :3] = rows
    kv.buffers[1][0][:, :, :3] = 7
    kv.buffers[1][1][:, :, :3] = 0.5
    kv.advance(3)
    assert not kv.grow(4)  # fits
    assert kv.grow(5) and made[-1] == (1, 8)  # doubled
    np.testing.assert_array_equal(kv.buffers[0][:, :, :3], rows)
    assert (kv.buffers[1][0][:, :, :3] == 7).all() and (kv.buffers[1][1][:, :, :3] == 0.5).all()
    assert (kv.buffers[0][:, :, 3:] == 0).all() and kv.length == 3
    assert kv.grow(17) and kv.capacity == 17  # at least what the step needs
    np.testing.assert_array_equal(kv.buffers[0][:, :, :3], rows)
    assert kv.grow(40) and kv.capacity == 20  # never past the limit


def test_check_refuses_steps_past_the_limit() -> None:
    kv, _ = _slots(limit=4)
    kv.reset(1)
    kv.advance(3)
    assert kv.check(np.asarray([[1]])).dtype == np.int64
    with pytest.raises(InputError, match="5 tokens exceed the model's context of 4"):
        kv.check(np.asarray([[1, 2]]))


def _greedy(dec: object, prompt: list[int], new: int, reserve: int) -> list[np.ndarray]:
    dec.reserve(reserve)  # type: ignore[attr-defined]
    dec.reset(1)  # type: ignore[attr-defined]
    out = [dec.forward(np.asarray([prompt]))[0, -1]]  # type: ignore[attr-defined]
    for _ in range(new):
        nxt = int(np.argmax(out[-1]))
        out.append(dec.forward(np.asarray([[nxt]]))[0, -1])  # type: ignore[attr-defined]
    return out


def test_the_onnxruntime_runner_grows_its_shared_buffers_keeping_the_rows(
    tiny_artifact: Path,
) -> None:
    from llmir_core.targets import open_artifact

    prompt = [1, 40, 17, 99, 5]
    roomy = _greedy(open_artifact(str(tiny_artifact), threads=1), prompt, 6, reserve=64)
    dec = open_artifact(str(tiny_artifact), threads=1)
    assert dec.shared
    tight = _greedy(dec, prompt, 6, reserve=2)  # 2 rows -> 5 (the prompt) -> 10 -> 20
    assert dec.capacity == 20 and dec.length == len(prompt) + 6
    for a, b in zip(roomy, tight):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_cache_buffers_give_one_zeroed_buffer_per_entry_with_its_dtype() -> None:
    from llmir_core.runtime.kv_slots import cache_buffers

    caches = [{"kv_heads": 2, "head_dim": 4}, {"kv_heads": 1, "head_dim": 8, "dtype": "i8"}]
    f32, i8 = cache_buffers(caches, 3, 5)
    assert f32.shape == (3, 2, 5, 4) and f32.dtype == np.float32 and not f32.any()
    assert i8.shape == (3, 1, 5, 8) and i8.dtype == np.int8 and not i8.any()


def test_the_batched_runner_allocates_and_checks_through_the_slots_module(
    tiny_artifact: Path,
) -> None:
    from llmir_core.targets.onnxruntime.batch_runner import OrtBatchDecoder

    dec = OrtBatchDecoder(str(tiny_artifact), 2, threads=1, max_context=8)
    assert dec.max_context == 8 and all(b.shape[0] == 2 and b.shape[2] == 8 for b in dec.buffers)
    dec.prefill(1, [1, 2, 3], 0)
    with pytest.raises(InputError, match="9 tokens exceed the model's context of 8") as e:
        dec.decode([1], [4], [8])
    assert e.value.hint
    with pytest.raises(InputError, match="max context must be >= 1, got 0"):
        OrtBatchDecoder(str(tiny_artifact), 1, threads=1, max_context=0)
