"""Decoding many sequences at once: slots of one preallocated KV buffer, one forward per step.

A `BatchDecoder` holds `slots` sequences, each in its own row of the KV buffers, each with its
own length. `prefill(slot, ids, start)` runs a chunk of one sequence's prompt after its first
`start` cached tokens; `decode(slots, ids, positions)` runs one token for each of several
sequences in one forward and returns one logits row per sequence. A slot is reused by the next
sequence without clearing: its rows past the new sequence's length are never read.
`prefill_rows` is `prefill` returning every position's logits (prompt log-probabilities): one
forward on an artifact built with `--logits all`, else one forward per token (each forward's
last row is that token's). `step(rows)` runs several sequences' chunks of any lengths (prompt
chunks and decode tokens) and returns each one's last logits row; `mixed_steps` says whether
that is one forward (a mixed batch, which the scheduler then prefers) or one per row.
`fork(src, dsts, length)` copies the KV rows of positions [0, length) of `src` into each slot
of `dsts`, which then hold that prefix as their own sequence and go on independently (`n`
choices of one prompt share its prefill).

- `OrtBatchDecoder` (llmir_core/targets/onnxruntime/batch_runner.py, through the onnxruntime
  target's `open_batch`) runs a shared-buffer onnxruntime decoder with every slot in one KV
  buffer and one forward per step.
- `SerialBatchDecoder` runs any single-sequence `Decoder` (the protocol of
  `llmir_core.runtime.generate`: the reference interpreter's `FunctionDecoder`, or another
  target) with one instance per slot, a forward per sequence: a target plugs into the server
  before it can batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from llmir_core.errors import InputError
from llmir_core.runtime.generate import Decoder


class BatchDecoder(Protocol):
    """What the serving scheduler needs from a target."""

    slots: int
    max_context: int
    vocab: int
    mixed_steps: bool  # `step` runs its rows in one forward (serve mixes prefill and decode)

    def prefill(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        """Run `ids` after the slot's first `start` tokens; return the last logits row [vocab]."""
        ...

    def prefill_rows(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        """`prefill`, returning the logits of every position of ids [len(ids), vocab]."""
        ...

    def decode(
        self, slots: Sequence[int], ids: Sequence[int], positions: Sequence[int]
    ) -> np.ndarray:
        """One token per slot (at its position); return logits [len(slots), vocab]."""
        ...

    def step(self, rows: Sequence[tuple[int, Sequence[int], int]]) -> np.ndarray:
        """(slot, ids, start) rows, distinct slots: `prefill` of each; logits [len(rows), vocab]."""
        ...

    def fork(self, src_slot: int, dst_slots: Sequence[int], length: int) -> None:
        """Copy the KV rows of positions [0, length) of `src_slot` into each of `dst_slots`."""
        ...


def check_fork(slots: int, src: int, dsts: Sequence[int], length: int, held: int) -> None:
    """Refuse a fork whose slots are out of range or include the source, or whose `length` is
    more than the `held` rows the source slot has."""
    bad = [d for d in dsts if not 0 <= d < slots or d == src]
    if not 0 <= src < slots or bad:
        raise InputError(f"cannot fork slot {src} into slots {list(dsts)} of {slots}")
    if not 0 <= length <= held:
        raise InputError(f"cannot fork {length} rows of slot {src}: it holds {held}")


class SerialBatchDecoder:
    """Any single-sequence `Decoder`, one instance per slot, run one sequence at a time."""

    def __init__(
        self, make: Callable[[], Decoder], slots: int, vocab: int, max_context: int
    ) -> None:
        if slots < 1:
            raise InputError(f"--max-batch must be >= 1, got {slots}")
        self.slots = slots
        self.vocab = vocab
        self.max_context = max_context
        self.mixed_steps = False  # a forward per row: mixing saves nothing
        self._decoders = [make() for _ in range(slots)]

    @classmethod
    def over(cls, open_one: Callable[[], Any], slots: int) -> SerialBatchDecoder:
        """`slots` decoders from `open_one()` (vocab and max_context read from the first)."""
        if slots < 1:
            raise InputError(f"--max-batch must be >= 1, got {slots}")
        first = open_one()
        limit = getattr(first, "max_context", None)
        if not limit:
            raise InputError(
                "batched serving needs a context limit: the artifact gives no max_len",
                hint="pass --max-context, or rebuild with --max-len",
            )
        made = [first]
        return cls(lambda: made.pop() if made else open_one(), slots, int(first.vocab), int(limit))

    def prefill(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        d = self._decoders[slot]
        if start == 0:
            d.reset(1)
        elif d.length != start:
            raise InputError(f"slot {slot} holds {d.length} tokens, not {start}")
        logits: np.ndarray = np.asarray(d.forward(np.asarray([list(ids)], dtype=np.int64)))[0, -1]
        return logits

    def prefill_rows(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        return np.stack([self.prefill(slot, [t], start + i) for i, t in enumerate(ids)])

    def decode(
        self, slots: Sequence[int], ids: Sequence[int], positions: Sequence[int]
    ) -> np.ndarray:
        return np.stack([self.prefill(s, [t], p) for s, t, p in zip(slots, ids, positions)])

    def step(self, rows: Sequence[tuple[int, Sequence[int], int]]) -> np.ndarray:
        return np.stack([self.prefill(s, ids, start) for s, ids, start in rows])

    def fork(self, src_slot: int, dst_slots: Sequence[int], length: int) -> None:
        """Through the slot decoders' `fork_into(dst, length)` (FunctionDecoder, the KV-slot
        runners of llmir_core.runtime.kv_slots)."""
        src = self._decoders[src_slot] if 0 <= src_slot < self.slots else None
        check_fork(self.slots, src_slot, dst_slots, length, src.length if src else 0)
        fork_into = getattr(src, "fork_into", None)
        if fork_into is None:
            raise InputError(f"{type(src).__name__} cannot copy its KV rows into another slot")
        for dst in dst_slots:
            fork_into(self._decoders[dst], length)


__all__ = ["BatchDecoder", "SerialBatchDecoder", "check_fork"]
