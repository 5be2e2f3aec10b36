"""The onnxruntime target's batched runner: many sequences in one KV buffer, one forward a step.

`OrtBatchDecoder` runs a decoder artifact (`llmir_core.targets.onnxruntime.serialize_decoder`) built with
`kv_cache: shared_buffer`. The graph computes GroupQueryAttention's `seqlens_k` per batch row
from `positions`, so rows of different lengths decode in one call with no change to the build:
the buffers are [slots, kv_heads, capacity, head_dim]; a decode step binds the first
`max(slot) + 1` rows (a contiguous view of the same memory), a prefill chunk binds the one
row of its slot. A row in the decode step's range that is not decoding (a free slot, or one
in the middle of its prefill) runs a dummy token at the last position, `capacity - 1`: a
sequence reads KV rows only up to its own position, and writes row `capacity - 1` itself
before it reads it, so the dummy write is never seen.

Mixed steps (`step`, on an artifact whose manifest says `decoder.mixed_batch`: llmir's
attention kernel, which knows pads): prompt chunks of several sequences and decode tokens in
one forward over rows [min(slot), max(slot)], S = the longest chunk. Row b holds its n_b tokens at the
end (columns S - n_b...) after pads (token 0 at position -1), which the attention neither
stores nor attends to; a row not in the step is pads only and does nothing (no dummy token).
The last column's logits are each row's last real token's.

`fork(src, dsts, length)` copies the first `length` rows of a slot into other slots, in place
in the numpy buffers the bindings read.

It implements `llmir_core.runtime.batch_decoder.BatchDecoder` (what the server's scheduler
drives); the target's `open_batch` opens it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from llmir_core.errors import InputError
from llmir_core.runtime.batch_decoder import check_fork
from llmir_core.runtime.kv_slots import (
    KVUsage,
    cache_buffers,
    cache_token_bytes,
    check_context,
    context_limit,
)


class OrtBatchDecoder:
    """A shared-buffer decoder artifact on onnxruntime, `slots` sequences in one KV buffer."""

    def __init__(
        self,
        art_dir: str,
        slots: int,
        *,
        threads: int | None = None,
        max_context: int | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> None:
        """manifest: read and checked by the caller (the target's `open_batch`), else read and
        checked here."""
        from llmir_core.targets.onnxruntime.runner import (
            artifact_session_options,
            load_decoder_manifest,
            release_freed_heap,
            resolve_threads,
        )

        if slots < 1:
            raise InputError(f"--max-batch must be >= 1, got {slots}")
        if manifest is None:
            manifest = load_decoder_manifest(art_dir)
        dec = manifest["decoder"]
        if dec.get("kv_cache") != "shared_buffer":
            raise InputError(
                f"{art_dir}: batched serving needs every attention layer fused "
                f"(kv_cache is '{dec.get('kv_cache')}'; not fused: "
                f"{dec.get('not_fused') or 'see the manifest'})",
                hint="serve with --max-batch 1, or rebuild from a model whose attention fuses",
            )
        limit = context_limit(dec.get("max_len"), max_context)
        if dec.get("max_len") is None or limit is None:  # the buffers hold max_len rows a slot
            raise InputError(f"{art_dir}: the manifest gives no max_len for the shared KV buffers")
        self.art_dir = art_dir
        self.manifest = manifest
        self.slots = slots
        self.max_context = int(limit)
        self.vocab = int(dec["vocab"])
        self.threads = resolve_threads(threads)
        import onnxruntime  # the artifact loaded above: session_options has imported it already

        self._ort = onnxruntime
        path = os.path.join(art_dir, manifest.get("model", "model.onnx"))
        so = artifact_session_options(manifest, self.threads)
        try:
            self.sess = self._ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InputError(
                f"{path}: onnxruntime cannot load the model: {str(exc).strip().splitlines()[0]}"
            ) from None
        release_freed_heap()
        self._caches: list[dict[str, Any]] = list(dec["cache"])
        self._logits_name = self.sess.get_outputs()[0].name
        self.buffers: list[np.ndarray] = cache_buffers(self._caches, slots, self.max_context)
        self.kv_usage = KVUsage(slots, self.max_context, cache_token_bytes(self._caches))
        self._bindings: dict[tuple[int, int], Any] = {}  # (first row, rows) -> an I/O binding
        self.mixed_steps = bool(dec.get("mixed_batch"))  # left pads at position -1 understood

    @property
    def kv_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    @property
    def kv_touched_bytes(self) -> int:
        """The KV rows written so far (KVUsage: serve's llmir_kv_touched_bytes)."""
        return self.kv_usage.touched_bytes

    def kernel_variants(self) -> dict[str, str]:
        """{op: "avx2" | "avx512-vnni"} for llmir's kernels in the graph (runner.OrtDecoder's)."""
        from llmir_core.targets.onnxruntime.runner import artifact_kernel_variants

        return artifact_kernel_variants(self.art_dir, self.manifest)

    def _binding(self, first: int, rows: int) -> Any:
        """An I/O binding whose caches are rows [first, first + rows) of the buffers (cached)."""
        key = (first, rows)
        io = self._bindings.get(key)
        if io is None:
            io = self.sess.io_binding()
            for c, buf in zip(self._caches, self.buffers):
                value = self._ort.OrtValue.ortvalue_from_numpy(buf[first : first + rows])
                io.bind_ortvalue_input(c["input"], value)
                io.bind_ortvalue_output(c["output"], value)
            self._bindings[key] = io
        return io

    @property
    def every_position(self) -> bool:
        """Whether the artifact computes every position's logits (built with `--logits all`)."""
        return self.manifest["decoder"].get("logits") != "last"

    def _run(
        self, io: Any, ids: np.ndarray, positions: np.ndarray, every: bool = False
    ) -> np.ndarray:
        """Logits [batch, vocab] of each row's last position (every: [batch, seq, vocab])."""
        rows = ids.shape[1] if self.every_position else 1
        logits = np.empty((ids.shape[0], rows, self.vocab), np.float32)
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("positions", positions)
        io.bind_ortvalue_output(self._logits_name, self._ort.OrtValue.ortvalue_from_numpy(logits))
        try:
            self.sess.run_with_iobinding(io)
        except Exception as exc:
            raise InputError(f"onnxruntime failed: {str(exc).strip().splitlines()[0]}") from None
        return logits if every else logits[:, -1]

    def prefill(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        check_context(start + len(ids), self.max_context)
        arr = np.asarray([list(ids)], dtype=np.int64)
        pos = np.arange(start, start + len(ids), dtype=np.int64)[None]
        logits: np.ndarray = self._run(self._binding(slot, 1), arr, pos)[0]
        self.kv_usage.wrote(slot, start + len(ids))
        return logits

    def prefill_rows(self, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        if not self.every_position:
            return np.stack([self.prefill(slot, [t], start + i) for i, t in enumerate(ids)])
        check_context(start + len(ids), self.max_context)
        arr = np.asarray([list(ids)], dtype=np.int64)
        pos = np.arange(start, start + len(ids), dtype=np.int64)[None]
        logits: np.ndarray = self._run(self._binding(slot, 1), arr, pos, every=True)[0]
        self.kv_usage.wrote(slot, start + len(ids))
        return logits

    def step(self, rows: Sequence[tuple[int, Sequence[int], int]]) -> np.ndarray:
        """One forward over (slot, ids, start) rows (distinct slots, mixed_steps artifacts):
        each row's last-token logits [len(rows), vocab]."""
        if not self.mixed_steps:
            raise InputError(f"{self.art_dir}: the artifact does not take mixed steps")
        first = min(slot for slot, _, _ in rows)  # rows [first, last slot] are bound
        n_rows = max(slot for slot, _, _ in rows) + 1 - first
        width = max(len(ids) for _, ids, _ in rows)
        tok = np.zeros((n_rows, width), np.int64)
        pos = np.full((n_rows, width), -1, np.int64)  # pads: see the docstring
        for slot, ids, start in rows:
            check_context(start + len(ids), self.max_context)
            n = len(ids)
            tok[slot - first, width - n :] = ids
            pos[slot - first, width - n :] = np.arange(start, start + n)
        logits = self._run(self._binding(first, n_rows), tok, pos)
        for slot, ids, start in rows:  # pads write nothing
            self.kv_usage.wrote(slot, start + len(ids))
        return logits[[slot - first for slot, _, _ in rows]]

    def decode(
        self, slots: Sequence[int], ids: Sequence[int], positions: Sequence[int]
    ) -> np.ndarray:
        if self.mixed_steps:  # rows not decoding are pads: they do nothing
            return self.step([(s, [t], p) for s, t, p in zip(slots, ids, positions)])
        rows = max(slots) + 1
        tok = np.zeros((rows, 1), np.int64)
        pos = np.full(
            (rows, 1), self.max_context - 1, np.int64
        )  # rows not decoding: see the docstring
        for s, t, p in zip(slots, ids, positions):
            check_context(p + 1, self.max_context)
            tok[s, 0], pos[s, 0] = t, p
        logits = self._run(self._binding(0, rows), tok, pos)
        self.kv_usage.decoded(slots, positions, rows)
        return logits[list(slots)]

    def fork(self, src_slot: int, dst_slots: Sequence[int], length: int) -> None:
        """Copy rows [0, length) of `src_slot` into each of `dst_slots` in every cache buffer
        (numpy owns them; onnxruntime reads them in place: int8 codes too, whose scales are the
        graph's constants)."""
        held = self.kv_usage.high[src_slot] if 0 <= src_slot < self.slots else 0
        check_fork(self.slots, src_slot, dst_slots, length, held)
        for buf in self.buffers:
            for dst in dst_slots:
                buf[dst, :, :length] = buf[src_slot, :, :length]
        for dst in dst_slots:
            self.kv_usage.wrote(dst, length)


__all__ = ["OrtBatchDecoder"]
