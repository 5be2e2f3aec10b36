"""Running a decoder artifact (built by `llmir_core.targets.onnxruntime.serialize_decoder`) on onnxruntime.

`open_decoder(dir)` reads manifest.json (its files checked) and returns an `OrtDecoder`, which implements the
`Decoder` protocol of `llmir_core.runtime.generate` (reset, forward, length, max_context).

With `kv_cache: shared_buffer` (every layer built as GroupQueryAttention) each cache entry is one
buffer [batch, kv_heads, capacity, head_dim], bound with I/O binding as both the past input and
the present output of the session, so onnxruntime writes the new rows in place and nothing is
copied between steps (int8 buffers for an int8 cache: kv-cache-int8{scales=calibrated}). The capacity is what `reserve(n)` asked for before `reset` (the generation
loop and the bench know prompt + new tokens), else 256; a longer sequence doubles it (one copy
of the rows so far, log2(n) times at most), up to `max_context`. (GroupQueryAttention touches the
whole buffer at prefill, so a buffer sized for the full context would cost its memory and time
on every prompt.) Otherwise (a layer fell back to concat attention) the present outputs stay
onnxruntime values and are bound as the next step's past inputs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from llmir_core.artifact_check import decoder_section
from llmir_core.errors import InputError
from llmir_core.interrupts import import_optional
from llmir_core.runtime import cpu_load, trace_attrs
from llmir_core.runtime.cpu_load import (
    DEFAULT_THREADS,
    auto_threads,
    busy_cores,
    busy_now,
    resolve_threads,
)
from llmir_core.runtime.kv_slots import (
    DEFAULT_CAPACITY,
    KVSlots,
    UsesKVSlots,
    cache_buffers,
    cache_dtype,
    context_limit,
)
from llmir_core.tracing import traced


def release_freed_heap() -> bool:
    """Hand the heap pages freed so far back to the system (glibc's malloc_trim; False where
    there is none). onnxruntime folds the rotary tables when a session loads (positions x
    inv_freq -> cos/sin, [context, rotary_dim/2] floats per table): the intermediate products it
    frees stay in the process's resident memory (~48 MB for Gemma 3's two tables of 32768
    positions) until trimmed."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))


def _ort() -> Any:
    ort = import_optional(
        "onnxruntime", "onnxruntime is not installed", hint="pip install onnxruntime"
    )
    # onnxruntime's own log lines (coloured whatever NO_COLOR says) stay off: every failure
    # reaches llmir as an exception, reported in its one-line form
    ort.set_default_logger_severity(4)
    return ort


def auto_spin(threads: int) -> bool:
    """Whether the intra-op pool's threads should spin between kernels: only when the cores are
    otherwise idle. Measured (SmolLM2-135M shape int4, 2 threads, other processes keeping both
    cores busy): spinning decoded 3.1x slower (4.3 vs 13.3 tok/s) and prefilled 1.3x slower, as
    a spinning thread takes the core the thread it waits for needs; on an idle machine spinning
    saves the wake-up of every parallel section (hundreds per decode step)."""
    if threads == 1:
        return False  # no pool threads
    try:
        return cpu_load.busy_now() < 0.25
    except (OSError, ValueError, IndexError):  # no /proc/stat: onnxruntime's default (spin)
        return True


def session_options(
    threads: int | None = None,
    spin: bool | None = None,
    custom_ops: Sequence[str] = (),
    prepack: str = "session",
) -> Any:
    """threads: intra-op threads (None = resolve_threads's default, 0 = onnxruntime's own).
    spin: let pool threads spin between kernels (None = `auto_spin`: only on an idle machine).
    custom_ops: the llmir custom-op libraries the model needs (its manifest's `custom_ops`).
    prepack: the artifact's `decoder.prepack` (lower-ort-module): "none" turns onnxruntime's
    weight prepacking off, so the weights stay memory-mapped as stored."""
    ort = _ort()
    so = ort.SessionOptions()
    if custom_ops:
        from llmir_core.targets.onnxruntime.native import register

        register(so, custom_ops)
    so.log_severity_level = 4  # errors reach llmir as exceptions; no coloured log lines
    n = resolve_threads(threads)
    if n:
        so.intra_op_num_threads = n
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if spin is None:
        spin = auto_spin(n or os.cpu_count() or 1)
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if prepack == "none":
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so


def artifact_session_options(
    manifest: dict[str, Any], threads: int | None = None, spin: bool | None = None
) -> Any:
    """session_options for a built decoder: the custom-op libraries and the prepack mode its
    manifest records (`custom_ops`, `decoder.prepack`)."""
    return session_options(
        threads,
        spin,
        manifest.get("custom_ops") or (),
        str(manifest.get("decoder", {}).get("prepack", "session")),
    )


class OrtDecoder(UsesKVSlots):
    """Prefill and decode through an onnxruntime session; the KV cache stays in bound buffers."""

    def __init__(
        self,
        art_dir: str,
        manifest: dict[str, Any],
        threads: int | None = None,
        max_context: int | None = None,
        spin: bool | None = None,
    ) -> None:
        dec = decoder_section(art_dir, manifest)
        self.art_dir = art_dir
        self.manifest = manifest
        self.decoder = dec
        self.caches: list[dict[str, Any]] = list(dec["cache"])
        self.shared = dec.get("kv_cache") == "shared_buffer"
        self.max_context = context_limit(dec.get("max_len"), max_context)
        if self.shared and self.max_context is None:
            raise InputError(f"{art_dir}: the manifest gives no max_len for the shared KV buffers")
        prepack = dec.get("prepack", "session")  # artifacts built before the field: "session"
        if prepack not in ("session", "none"):
            raise InputError(
                f"{art_dir}: manifest field 'decoder.prepack' must be 'session' or 'none', "
                f"got {prepack!r}",
                hint="rebuild the artifact with `llmir build`",
            )
        self.threads = resolve_threads(threads)
        # decided here (not inside session_options) so that benches can report it: whether the
        # pool threads spin is the one setting that changes a 2-thread decode step by more
        # than the graph does (docs/perf.md, "int4 decode against onnxruntime-genai")
        self.spin: bool = (
            spin if spin is not None else auto_spin(self.threads or os.cpu_count() or 1)
        )
        ort = _ort()
        path = os.path.join(art_dir, manifest.get("model", "model.onnx"))
        so = artifact_session_options(manifest, self.threads, self.spin)
        try:
            self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InputError(
                f"{path}: onnxruntime cannot load the model: {str(exc).strip().splitlines()[0]}"
            ) from None
        release_freed_heap()
        self.io = self.sess.io_binding()
        # shared mode: the cache memory (numpy owns it), bound in and out of the session
        self.kv = KVSlots(self.max_context, self._make_buffers, self._bind_buffers)
        self._values: list[Any] = []  # the OrtValues bound as past inputs
        self._logits_name = self.sess.get_outputs()[0].name
        self._last_only = dec.get("logits") == "last"
        self._logits: dict[int, tuple[np.ndarray, Any]] = {}
        self._step_bound = False  # the one-token buffers below are bound
        self._step_ids = np.zeros((0, 1), np.int64)
        self._step_pos = np.zeros((0, 1), np.int64)

    @property
    def vocab(self) -> int:
        return int(self.decoder["vocab"])

    @property
    def buffers(self) -> list[np.ndarray]:
        return self.kv.buffers

    def use_session(self, sess: Any) -> None:
        """Run on `sess` (the same model, e.g. opened with profiling on) from the next `reset`:
        a fresh I/O binding, the KV and logits buffers bound again to it."""
        self.sess = sess
        self.io = sess.io_binding()
        self.kv.drop()
        self._values = []
        self._logits = {}
        self._step_bound = False

    def reset(self, batch: int = 1) -> None:
        """Start new sequences; the shared buffers are kept when batch and capacity still fit."""
        self.kv.reset(batch, allocate=self.shared)
        if not self.shared:
            ort = _ort()
            self._values = [
                ort.OrtValue.ortvalue_from_numpy(
                    np.zeros((batch, c["kv_heads"], 0, c["head_dim"]), cache_dtype(c))
                )
                for c in self.caches
            ]

    def _make_buffers(self, batch: int, capacity: int) -> list[Any]:
        return cache_buffers(self.caches, batch, capacity)

    def fork_into(self, dst: UsesKVSlots, length: int) -> None:
        """dst (an OrtDecoder of the same artifact) holds this one's first `length` KV rows:
        copied between the shared buffers, or out of the cache values onnxruntime returned."""
        if self.shared or not isinstance(dst, OrtDecoder):
            super().fork_into(dst, length)
            return
        if length > self.length:
            raise InputError(f"cannot fork {length} positions: the decoder holds {self.length}")
        dst.reset(self.batch)
        ort = _ort()
        dst._values = [
            ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v.numpy()[:, :, :length]))
            for v in self._values
        ]
        dst.kv.advance(length)

    def _bind_buffers(self, buffers: list[Any]) -> None:
        """Bind new shared buffers as both the past inputs and the present outputs."""
        ort = _ort()
        self._values = [ort.OrtValue.ortvalue_from_numpy(b) for b in buffers]
        for c, v in zip(self.caches, self._values):
            self.io.bind_ortvalue_input(c["input"], v)
            self.io.bind_ortvalue_output(c["output"], v)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """Run ids [batch, seq] after what is cached; return logits [batch, seq (or 1), vocab]."""
        ids = self.kv.check(ids)
        batch, seq = ids.shape
        if not self.batch:
            self.reset(batch)
        if batch > 1 and seq > 1 and self.length and self.decoder.get("fused_attention_layers"):
            # GroupQueryAttention takes a multi-token chunk after a cached prefix only for batch 1
            steps = [self.forward(ids[:, i : i + 1]) for i in range(seq)]
            return steps[-1] if self._last_only else np.concatenate(steps, axis=1)
        if self.shared:
            self.kv.grow(self.length + seq)
        io = self.io
        rows = 1 if self._last_only else seq
        if seq == 1 and self.shared:
            # a decode step: inputs and logits live in buffers bound once (just write the values)
            logits = self._bind_step(batch)
            self._step_ids[:] = ids
            self._step_pos[:] = self.length
        else:
            self._step_bound = False
            positions = np.ascontiguousarray(
                np.broadcast_to(
                    np.arange(self.length, self.length + seq, dtype=np.int64), (batch, seq)
                )
            )
            io.bind_cpu_input("input_ids", ids)
            io.bind_cpu_input("positions", positions)
            if not self.shared:
                for c, v in zip(self.caches, self._values):
                    io.bind_ortvalue_input(c["input"], v)
                    io.bind_output(c["output"])
            logits, logits_value = self._logits_buffer(batch, rows)
            io.bind_ortvalue_output(self._logits_name, logits_value)
        try:
            self.sess.run_with_iobinding(io)
        except Exception as exc:
            raise InputError(f"onnxruntime failed: {str(exc).strip().splitlines()[0]}") from None
        if not self.shared:
            by_name = dict(zip(self._output_order(), io.get_outputs()))
            self._values = [by_name[c["output"]] for c in self.caches]
        self.kv.advance(seq)
        return logits.copy() if rows == 1 else logits

    def _bind_step(self, batch: int) -> np.ndarray:
        """Bind the one-token ids/positions buffers and the logits buffer (once per batch size)."""
        if not self._step_bound or self._step_ids.shape[0] != batch:
            ort = _ort()
            self._step_ids = np.zeros((batch, 1), np.int64)
            self._step_pos = np.zeros((batch, 1), np.int64)
            self.io.bind_ortvalue_input(
                "input_ids", ort.OrtValue.ortvalue_from_numpy(self._step_ids)
            )
            self.io.bind_ortvalue_input(
                "positions", ort.OrtValue.ortvalue_from_numpy(self._step_pos)
            )
            self.io.bind_ortvalue_output(self._logits_name, self._logits_buffer(batch, 1)[1])
            self._step_bound = True
        return self._logits[batch][0]

    def _logits_buffer(self, batch: int, rows: int) -> tuple[np.ndarray, Any]:
        """Where onnxruntime writes the logits: a reused buffer for one row (decode steps,
        copied out), a fresh one (returned as is) for a prompt."""
        if rows == 1 and batch in self._logits:
            return self._logits[batch]
        arr = np.empty((batch, rows, self.vocab), np.float32)
        out = (arr, _ort().OrtValue.ortvalue_from_numpy(arr))
        if rows == 1:
            self._logits[batch] = out
        return out

    def _output_order(self) -> list[str]:
        """Bound outputs in binding order: the caches (bound first), then the logits."""
        return [c["output"] for c in self.caches] + [self._logits_name]

    def profile_sources(self) -> tuple[Any, dict[str, dict[str, str]]]:
        """The model's ONNX graph (no weights: imports onnx) and the .llmir op each node was
        emitted for (`nodeinfo.node_sources`): what `llmir profile` maps kernel times to."""
        import onnx

        from llmir_core.targets.onnxruntime.nodeinfo import node_sources

        path = os.path.join(self.art_dir, self.manifest.get("model", "model.onnx"))
        graph = onnx.load(path, load_external_data=False)
        return graph, node_sources(graph)

    def start_profiling(self, prefix: str) -> None:
        """Run on a new session of the same model with onnxruntime's profiler on (its file
        named `prefix*`; `self.sess.end_profiling()` ends it and returns the path)."""
        so = artifact_session_options(self.manifest, self.threads)
        so.enable_profiling = True
        so.profile_file_prefix = prefix
        path = os.path.join(self.art_dir, self.manifest.get("model", "model.onnx"))
        self.use_session(_ort().InferenceSession(path, so, providers=["CPUExecutionProvider"]))

    def kernel_variants(self) -> dict[str, str]:
        """The instruction-set variant each of llmir's kernels in this artifact's graph runs
        with ({op name: "avx2" | "avx512-vnni"}; {} when it runs none): `llmir bench` reports it."""
        return artifact_kernel_variants(self.art_dir, self.manifest)

    def cache_pointers(self) -> list[int]:
        """Data addresses of the bound cache values (stay fixed across steps in shared mode)."""
        return [int(v.data_ptr()) for v in self._values]


def artifact_kernel_variants(art_dir: str, manifest: dict[str, Any]) -> dict[str, str]:
    """{op: variant} (native.kernel_variants) for the ai.llmir op types the artifact's ONNX graph
    holds (its nodes' domain and op_type read straight from the protobuf: no onnx import, no
    weights); {} for an artifact without llmir's library."""
    if not manifest.get("custom_ops"):
        return {}
    from llmir_core.artifact_check import _pb_field, _pb_fields
    from llmir_core.targets.onnxruntime.native import DOMAIN, kernel_variants

    path = os.path.join(art_dir, manifest.get("model", "model.onnx"))
    with open(path, "rb") as fh:
        model = memoryview(fh.read())
    used = set()
    try:
        graph = _pb_field(model, 7)  # ModelProto.graph
        for node in _pb_fields(graph, 1) if graph is not None else ():  # GraphProto.node
            domain, op_type = _pb_field(node, 7), _pb_field(node, 4)  # NodeProto fields
            if domain is not None and op_type is not None and bytes(domain).decode() == DOMAIN:
                used.add(bytes(op_type).decode())
    except (ValueError, UnicodeDecodeError):
        return {}  # not a readable graph: the session that opened it would have said so
    return {op: v for op, v in sorted(kernel_variants().items()) if op in used}


def load_decoder_manifest(art_dir: str) -> dict[str, Any]:
    from llmir_core.targets.onnxruntime.session import load_manifest

    if not os.path.isdir(art_dir):
        raise InputError(
            f"{art_dir}: not a folder", hint="pass an artifact folder built by `llmir build`"
        )
    manifest = load_manifest(art_dir)
    decoder_section(art_dir, manifest)
    return manifest


@traced("load", after=trace_attrs.loaded)  # tracing
def open_decoder(
    art_dir: str,
    threads: int | None = None,
    max_context: int | None = None,
    spin: bool | None = None,
) -> OrtDecoder:
    """The decoder in an artifact folder, ready for `reset` and `forward`."""
    return OrtDecoder(art_dir, load_decoder_manifest(art_dir), threads, max_context, spin)


__all__ = [
    "OrtDecoder",
    "open_decoder",
    "load_decoder_manifest",
    "session_options",
    "auto_threads",
    "busy_cores",
    "busy_now",
    "resolve_threads",
    "auto_spin",
    "DEFAULT_THREADS",
    "DEFAULT_CAPACITY",
]
