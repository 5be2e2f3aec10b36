"""Mixed steps: prompt chunks of several sequences and decode rows in one forward (left-padded
rows on llmir's attention kernel, `OrtBatchDecoder.step`); the scheduler's greedy outputs stay
those of one sequence alone; artifacts on onnxruntime's attention keep today's schedule."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.batch_decoder import SerialBatchDecoder
from llmir_core.runtime.sampling import Sampler, SamplingConfig
from llmir_core.serve.scheduler import Completion, GenRequest, Scheduler
from llmir_core.targets.onnxruntime.batch_runner import OrtBatchDecoder
from llmir_core.targets.onnxruntime.native import unavailable_reason
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .test_batching import alone

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


class Steps:
    """A BatchDecoder that logs each `step` forward's rows (ids per row) and each decode."""

    def __init__(self, inner: OrtBatchDecoder) -> None:
        self.inner = inner
        self.slots, self.max_context, self.vocab = inner.slots, inner.max_context, inner.vocab
        self.mixed_steps = inner.mixed_steps
        self.calls: list[tuple[str, list[int]]] = []

    def prefill(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        self.calls.append(("prefill", [len(ids)]))
        return self.inner.prefill(slot, ids, start)

    def prefill_rows(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        return self.inner.prefill_rows(slot, ids, start)

    def decode(
        self, slots: Sequence[int], ids: Sequence[int], positions: Sequence[int]
    ) -> np.ndarray:
        self.calls.append(("decode", [1] * len(slots)))
        return self.inner.decode(slots, ids, positions)

    def step(self, rows: Sequence[tuple[int, Sequence[int], int]]) -> np.ndarray:
        self.calls.append(("step", [len(ids) for _, ids, _ in rows]))
        return self.inner.step(rows)


@needs_kernel
def test_step_equals_prefill_and_decode_per_row(tiny_artifact: Path) -> None:
    """One forward over rows of 1, 5 and 9 new tokens after different prefixes (and a slot
    left out) gives each row's last logits as its own forward does, and leaves the slot that
    is not in the step untouched."""
    ref = OrtBatchDecoder(str(tiny_artifact), 4, threads=1, max_context=64)
    dec = OrtBatchDecoder(str(tiny_artifact), 4, threads=1, max_context=64)
    assert dec.mixed_steps
    prompts = {0: [1, 5, 6, 7], 1: [1, 9], 2: [1, 20, 21, 22, 23, 24, 25], 3: [1, 30, 31]}
    for d in (ref, dec):
        for slot, p in prompts.items():
            d.prefill(slot, p, 0)
    kept = [b[2].copy() for b in dec.buffers]
    rows = [(0, [8], 4), (1, [10, 11, 12, 13, 14], 2), (3, list(range(40, 49)), 3)]
    got = dec.step(rows)
    want = [ref.prefill(slot, ids, start) for slot, ids, start in rows]
    assert got.shape == (3, dec.vocab)
    for g, w in zip(got, want):
        assert _rel(g, w) <= 1e-4
    assert all(np.array_equal(b[2], k) for b, k in zip(dec.buffers, kept))
    # the next tokens: the KV rows the mixed step wrote are those the forwards alone wrote
    nxt = [(0, 3, 5), (1, 4, 7), (3, 5, 12)]
    after = dec.decode([s for s, _, _ in nxt], [t for _, t, _ in nxt], [p for _, _, p in nxt])
    for (slot, tok, pos), row in zip(nxt, after):
        assert _rel(row, ref.prefill(slot, [tok], pos)) <= 1e-4


def test_serial_decoder_steps_row_by_row(tiny_artifact: Path) -> None:
    dec = SerialBatchDecoder(lambda: open_decoder(str(tiny_artifact), 1), 2, 128, 64)
    ref = SerialBatchDecoder(lambda: open_decoder(str(tiny_artifact), 1), 2, 128, 64)
    assert not dec.mixed_steps
    got = dec.step([(0, [1, 5, 6], 0), (1, [1, 9], 0)])
    assert _rel(got[1], ref.prefill(1, [1, 9], 0)) <= 1e-6


def test_onnxruntime_attention_takes_no_mixed_steps(tiny_module: Any, tmp_path: Path) -> None:
    """onnxruntime's attention does not know pads: the manifest says so, `step` refuses, and the
    scheduler keeps one prefill forward of one sequence per step."""
    from llmir_core.targets import build

    art = tmp_path / "ort"
    build(tiny_module, str(art), "onnxruntime", options={"attention_kernel": "onnxruntime"})
    assert json.loads((art / "manifest.json").read_text())["decoder"]["mixed_batch"] is False
    dec = OrtBatchDecoder(str(art), 2, threads=1, max_context=64)
    with pytest.raises(InputError, match="does not take mixed steps"):
        dec.step([(0, [1, 2], 0)])
    assert not Scheduler(dec, lambda ids: "").mixed


def _submit(
    sched: Scheduler, prompts: list[list[int]], n: int, on_text: Any = lambda s: None
) -> list[threading.Event]:
    """Queue the prompts (all seen by the same loop iteration); their completions land in
    `sched.done_`."""
    events = []
    with sched._cond:  # the loop admits them together
        for p in prompts:
            ev = threading.Event()

            def finished(e: threading.Event, key: tuple[int, ...], r: object) -> None:
                assert isinstance(r, Completion), r
                sched.done_[key] = r  # type: ignore[attr-defined]
                e.set()

            done = functools.partial(finished, ev, tuple(p))
            sched.submit(GenRequest(p, n, Sampler(SamplingConfig()), on_text, done))
            events.append(ev)
    return events


@needs_kernel
def test_mixed_steps_keep_greedy_outputs(tiny_artifact: Path) -> None:
    """Clients with prompts of 2 to 30 tokens arrive while another decodes: their chunks share
    forwards with each other and with the decode rows, and every greedy text is the one the
    prompt gets alone."""
    first = [1, 5, 6, 7, 8, 9, 10]
    later = [[1, 20, 21], [1, *range(30, 59)], [1, 50], [1, 60, 61, 62, 63, 64, 65]]
    want = {tuple(p): alone(tiny_artifact, p, 12) for p in [first, *later]}
    dec = Steps(OrtBatchDecoder(str(tiny_artifact), 4, threads=1, max_context=128))
    sched = Scheduler(dec, lambda ids: "x" * len(ids), chunk=8)  # type: ignore[arg-type]
    sched.done_ = {}  # type: ignore[attr-defined]
    started = threading.Event()
    _submit(sched, [first], 12, lambda s: started.set())
    sched.start()
    assert started.wait(30)  # the first one decodes
    events = _submit(sched, later[:2], 12)
    assert all(e.wait(60) for e in events)
    events = _submit(sched, later[2:], 12)
    assert all(e.wait(60) for e in events), "the scheduler hung"
    sched.close()
    assert sched.join(30)
    for p in [first, *later]:
        assert sched.done_[tuple(p)].token_ids == want[tuple(p)], p  # type: ignore[attr-defined]
    snap = sched.snapshot()
    assert snap["mixed_steps"] >= 1 and snap["prefill_batches"] >= 2
    steps = [rows for kind, rows in dec.calls if kind == "step"]
    # several prompts' chunks in one forward (8-token chunks of the 3 and 29 token prompts)
    assert any(sorted(rows)[-2:] == [3, 8] or rows.count(8) >= 2 for rows in steps), steps
    assert any(1 in rows and max(rows) > 1 for rows in steps), steps  # a mixed batch
    assert not any(kind == "prefill" for kind, _ in dec.calls)  # no single-sequence forward
