"""KV-cache capacity bookkeeping shared by the decoders that keep preallocated cache buffers
(onnxruntime's shared buffers, the Triton runner's device buffers).

A decoder holds `capacity` rows per cache entry, fills `length` of them, and never goes past its
context limit (the manifest's `max_len` or the caller's `max_context`, whichever is smaller).
`reserve(tokens)` sizes the next reset; a step past the capacity doubles it (at least to what the
step needs, at most to the limit), keeping the rows already written.
"""

from __future__ import annotations

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


def check_step(ids: np.ndarray, batch: int, length: int, limit: int | None) -> np.ndarray:
    """`ids` as contiguous int64 [batch, seq], checked against the cache's state: the batch it was
    reset for (0: not reset yet, any batch) and the context limit."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.ndim != 2:
        raise InputError(f"input ids must be [batch, seq], got shape {list(ids.shape)}")
    if batch and ids.shape[0] != batch:
        raise InputError(f"batch {ids.shape[0]} differs from the {batch} the cache was reset for")
    if limit is not None and length + ids.shape[1] > limit:
        raise InputError(
            f"{length + ids.shape[1]} tokens exceed the model's context of {limit}",
            hint="use a shorter prompt or fewer --max-new-tokens",
        )
    return ids


__all__ = ["DEFAULT_CAPACITY", "check_step", "context_limit", "grown_capacity", "reset_capacity"]
