"""The KV slots of a decoder that keeps preallocated cache buffers: one module for every
runner (onnxruntime's shared buffers, the Triton runner's device buffers).

A decoder holds `batch` sequences in `capacity` rows per cache entry, fills `length` of them,
and never goes past its context limit (the manifest's `max_len` or the caller's `max_context`,
whichever is smaller). `KVSlots` keeps that state and the buffers: `reserve(tokens)` sizes the
next `reset`; `reset(batch)` allocates when the batch changes or the reserved rows do not fit;
`grow(needed)` before a step past the capacity doubles it (at least to what the step needs, at
most to the limit), copying the rows already written into the new buffers (`copy_rows`);
`advance(seq)` after the step. The runner gives `make(batch, capacity)` (its buffers: any
arrays whose third axis is the row, numpy or torch; None or tuples of them) and `bind(buffers)`
(called after each allocation, to hand the new buffers to its session).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from llmir_core.errors import InputError

DEFAULT_CAPACITY = 256  # KV rows allocated at reset when nothing was reserved


def context_limit(max_len: int | None, max_context: int | None) -> int | None:
    """The tokens a sequence may hold: the smaller of the model's `max_len` and the caller's
    `max_context` (None: no limit known)."""
    if max_context is not None and max_context < 1:
        raise InputError(f"max context must be >= 1, got {max_context}")
    given = [x for x in (max_len, max_context) if x]
    return min(given) if given else None


def reset_capacity(reserved: int | None, limit: int | None) -> int:
    """The rows to allocate at a reset: what `reserve` asked for (else DEFAULT_CAPACITY), capped."""
    want = reserved or DEFAULT_CAPACITY
    return min(want, limit) if limit is not None else want


def grown_capacity(capacity: int, needed: int, limit: int | None) -> int:
    """The rows after growing a full buffer to hold `needed`: doubled, at least `needed`, capped."""
    grown = max(2 * capacity, needed)
    return min(grown, limit) if limit is not None else grown


def check_context(end: int, limit: int | None) -> None:
    """Refuse a step that would fill the cache to `end` tokens, past the context limit."""
    if limit is not None and end > limit:
        raise InputError(
            f"{end} tokens exceed the model's context of {limit}",
            hint="use a shorter prompt or fewer --max-new-tokens",
        )


def cache_dtype(spec: dict[str, Any]) -> type:
    """The numpy dtype of a manifest cache entry: int8 codes (kv-cache-int8) or f32."""
    return np.int8 if spec.get("dtype") == "i8" else np.float32


def cache_buffers(caches: Sequence[dict[str, Any]], batch: int, capacity: int) -> list[Any]:
    """One zeroed numpy buffer [batch, kv_heads, capacity, head_dim] per manifest cache entry
    (a `make` for numpy runners: rows are sequences, the third axis the KV rows)."""
    return [
        np.zeros((batch, c["kv_heads"], capacity, c["head_dim"]), cache_dtype(c)) for c in caches
    ]


def cache_token_bytes(caches: Sequence[dict[str, Any]]) -> int:
    """The bytes one position of one sequence takes in the buffers of `cache_buffers` (every
    manifest cache entry: kv_heads x head_dim x its dtype's size)."""
    return sum(
        int(c["kv_heads"]) * int(c["head_dim"]) * np.dtype(cache_dtype(c)).itemsize for c in caches
    )


class KVUsage:
    """The KV rows each slot of a batch decoder has written, for serve's /metrics.

    A slot's rows are written from position 0 up: `wrote(slot, end)` after a step that wrote
    positions below `end` keeps the slot's high-water mark (a slot reused by a shorter sequence
    keeps its mark: those rows were written). `dummy(slot)`: the batch step wrote the slot's
    last row, `limit - 1` (OrtBatchDecoder's stand-in token for a row not decoding).
    `touched_bytes` = the rows so written, summed over slots, x `token_bytes`: a lower bound of
    the KV memory the OS backs (zeroed buffers get their pages on first write, so the resident
    memory is this rounded up to pages per slot, kv head and cache entry)."""

    def __init__(self, slots: int, limit: int, token_bytes: int) -> None:
        self.limit = limit
        self.token_bytes = token_bytes
        self.high = [0] * slots
        self.last_row = [False] * slots

    def wrote(self, slot: int, end: int) -> None:
        self.high[slot] = max(self.high[slot], min(end, self.limit))

    def dummy(self, slot: int) -> None:
        self.last_row[slot] = True

    def decoded(self, slots: Sequence[int], positions: Sequence[int], rows: int) -> None:
        """A batch step over rows [0, rows): `slots` wrote their `positions`, the others the
        dummy row."""
        for s, p in zip(slots, positions):
            self.wrote(s, p + 1)
        for s in set(range(rows)).difference(slots):
            self.dummy(s)

    @property
    def touched_bytes(self) -> int:
        rows = sum(
            h + (1 if last and h < self.limit else 0) for h, last in zip(self.high, self.last_row)
        )
        return rows * self.token_bytes


def check_step(ids: np.ndarray, batch: int, length: int, limit: int | None) -> np.ndarray:
    """`ids` as contiguous int64 [batch, seq], checked against the cache's state: the batch it was
    reset for (0: not reset yet, any batch) and the context limit."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.ndim != 2:
        raise InputError(f"input ids must be [batch, seq], got shape {list(ids.shape)}")
    if batch and ids.shape[0] != batch:
        raise InputError(f"batch {ids.shape[0]} differs from the {batch} the cache was reset for")
    check_context(length + ids.shape[1], limit)
    return ids


def copy_rows(new: Sequence[Any], old: Sequence[Any], keep: int) -> None:
    """The first `keep` rows (third axis) of each old buffer into the new one (None skipped,
    tuples element by element)."""
    for n, o in zip(new, old):
        if n is None or o is None:
            continue
        if isinstance(n, tuple):
            copy_rows(n, o, keep)
        else:
            n[:, :, :keep] = o[:, :, :keep]


class KVSlots:
    """The rows of a decoder's preallocated KV buffers (see the module docstring)."""

    def __init__(
        self,
        limit: int | None,
        make: Callable[[int, int], list[Any]],
        bind: Callable[[list[Any]], None] | None = None,
    ) -> None:
        self.limit = limit
        self.make = make
        self.bind = bind
        self.buffers: list[Any] = []
        self.batch = 0
        self.capacity = 0
        self.length = 0
        self.reserved: int | None = None

    def reserve(self, tokens: int) -> None:
        """Size the buffers of the next `reset` for `tokens` positions (capped at the limit)."""
        self.reserved = max(1, int(tokens))

    def reset(self, batch: int, *, allocate: bool = True) -> None:
        """Start `batch` new sequences; the buffers are kept when batch and capacity still fit
        (allocate=False: a runner that keeps no buffers, only the bookkeeping)."""
        if batch < 1:
            raise InputError(f"batch must be >= 1, got {batch}")
        if allocate:
            want = reset_capacity(self.reserved, self.limit)
            if batch != self.batch or not self.buffers or self.capacity < want:
                self.allocate(batch, want)
        self.length = 0
        self.batch = batch

    def allocate(self, batch: int, capacity: int, keep: int = 0) -> None:
        """New buffers of `capacity` rows, the first `keep` rows copied from the old ones."""
        old = self.buffers
        new = self.make(batch, capacity)
        if keep:
            copy_rows(new, old, keep)
        self.buffers = new
        self.capacity = capacity
        if self.bind is not None:
            self.bind(new)

    def check(self, ids: np.ndarray) -> np.ndarray:
        """`ids` as contiguous int64 [batch, seq], checked against the batch and the limit."""
        return check_step(ids, self.batch, self.length, self.limit)

    def grow(self, needed: int) -> bool:
        """Make room for `needed` rows (the rows so far kept); whether it allocated."""
        if needed <= self.capacity:
            return False
        self.allocate(self.batch, grown_capacity(self.capacity, needed, self.limit), self.length)
        return True

    def advance(self, seq: int) -> None:
        """`seq` more rows were written."""
        self.length += seq

    def drop(self) -> None:
        """Forget the buffers (a new session): the next `reset` allocates."""
        self.buffers = []
        self.capacity = 0
        self.batch = 0


class UsesKVSlots:
    """A runner whose KV rows live in `self.kv`: its Decoder-protocol state (`length`, `batch`,
    `capacity`) and `reserve` read through to the slots; `fork_into` copies its rows into
    another such runner (a batch of per-slot runners forking a shared prompt)."""

    kv: KVSlots

    def reset(self, batch: int = 1) -> None:
        raise NotImplementedError  # the runner's own

    def fork_into(self, dst: UsesKVSlots, length: int) -> None:
        """dst holds this runner's first `length` KV rows (every sequence of the batch) as its
        whole cache, in buffers of its own."""
        if length > self.length:
            raise InputError(f"cannot fork {length} positions: the decoder holds {self.length}")
        dst.reset(self.batch)
        dst.kv.grow(length)
        copy_rows(dst.kv.buffers, self.kv.buffers, length)
        dst.kv.advance(length)

    @property
    def length(self) -> int:
        return self.kv.length

    @property
    def batch(self) -> int:
        return self.kv.batch

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    def reserve(self, tokens: int) -> None:
        """Size the KV buffers of the next `reset` for `tokens` positions (capped at the limit)."""
        self.kv.reserve(tokens)


__all__ = [
    "DEFAULT_CAPACITY",
    "KVSlots",
    "KVUsage",
    "UsesKVSlots",
    "cache_buffers",
    "cache_dtype",
    "cache_token_bytes",
    "check_context",
    "check_step",
    "context_limit",
    "copy_rows",
    "grown_capacity",
    "reset_capacity",
]
