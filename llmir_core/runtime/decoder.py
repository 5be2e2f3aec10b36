"""Running a decoder step by step, whatever executes it.

The decoder convention (the vLLM export convention the design names): a function takes
`input_ids [batch, seq] i64`, `positions [batch, seq] i64`, then one past tensor per cache entry
(`[batch, kv_heads, past, head_dim]`, in a fixed order); it returns logits `[batch, seq, vocab]`
followed by the present tensors (`past + seq` long) in the same order.

`FunctionDecoder` drives any callable with that signature (the reference interpreter, or an
onnxruntime session) and keeps the cache between calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llmir_core.errors import InputError
from llmir_core.ir.core import Function
from llmir_core.ir.types import TensorType, numpy_dtype


@dataclass(frozen=True)
class CacheSpec:
    name: str
    kv_heads: int
    head_dim: int
    dtype: np.dtype


def cache_specs(fn: Function) -> list[CacheSpec]:
    """Read the cache inputs from a decoder function's signature."""
    names = [a.name for a in fn.args]
    if names[:2] != ["input_ids", "positions"]:
        raise InputError(
            f"@{fn.name} is not a decoder: its inputs must start with input_ids, positions "
            f"(has {', '.join(names[:3])})",
            hint="import a Hugging Face folder or a GGUF file with `llmir import`",
        )
    specs = []
    for a in fn.args[2:]:
        t = a.type
        if (
            not isinstance(t, TensorType)
            or t.rank != 4
            or not isinstance(t.shape[1], int)
            or not isinstance(t.shape[3], int)
            or t.is_quantized
        ):
            raise InputError(
                f"decoder cache input {a.name} must be [batch, kv_heads, past, head_dim], has {t}"
            )
        specs.append(CacheSpec(a.name, t.shape[1], t.shape[3], numpy_dtype(t.dtype)))  # type: ignore[arg-type]
    return specs


Call = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]]


class FunctionDecoder:
    """Prefill and decode through a callable; the cache is held here between steps."""

    def __init__(self, call: Call, specs: list[CacheSpec], max_context: int | None = None) -> None:
        self.call = call
        self.specs = specs
        self.max_context = max_context
        self.cache: list[np.ndarray] = []
        self.length = 0

    def reset(self, batch: int = 1) -> None:
        self.cache = [np.zeros((batch, s.kv_heads, 0, s.head_dim), s.dtype) for s in self.specs]
        self.length = 0

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """Run `ids [batch, seq]` after what is cached; return logits [batch, seq, vocab]."""
        ids = np.asarray(ids, dtype=np.int64)
        batch, seq = ids.shape
        if not self.cache:
            self.reset(batch)
        if self.max_context is not None and self.length + seq > self.max_context:
            raise InputError(
                f"{self.length + seq} tokens exceed the model's context of {self.max_context}",
                hint="use a shorter prompt or fewer --max-new-tokens",
            )
        positions = np.broadcast_to(
            np.arange(self.length, self.length + seq, dtype=np.int64), (batch, seq)
        )
        feeds = {"input_ids": ids, "positions": np.ascontiguousarray(positions)}
        for s, c in zip(self.specs, self.cache):
            feeds[s.name] = c
        outs = self.call(feeds)
        logits, present = outs[0], list(outs[1:])
        if len(present) != len(self.specs):
            raise InputError(
                f"decoder returned {len(present)} cache tensors, expected {len(self.specs)}"
            )
        self.cache = present
        self.length += seq
        return np.asarray(logits)

    def fork_into(self, dst: FunctionDecoder, length: int) -> None:
        """dst holds this decoder's first `length` cached positions as its whole cache."""
        if length > self.length:
            raise InputError(f"cannot fork {length} positions: the decoder holds {self.length}")
        dst.cache = [c[:, :, :length].copy() for c in self.cache]
        dst.length = length
