"""Where a decoder's time goes: onnxruntime's per-node profile mapped back onto the .llmir ops.

`profile_artifact(dir)` opens the artifact's decoder, times a few decode steps without the
profiler (the reference step time), then reopens it with onnxruntime profiling on
(`SessionOptions.enable_profiling`), runs one unmeasured prefill and a few decode steps, then a
measured prefill of `prompt_len` random tokens and `decode_steps` decode steps. Each onnxruntime
node carries the .llmir op it was emitted for (`llmir_core.targets.onnxruntime.nodeinfo`: the lowered op's
name, its line:col in the lowered module the build wrote into the artifact, `model.lowered.llmir`,
and its `loc`, the source location it was imported from), so every kernel's time lands on one op
of the lowered module; the report ranks those ops by their share of the step (`model_run` wall
time) and says how much of the step named ops cover.

An op's time is its kernels' time plus their dispatch: the wall time between the end of the
previous kernel and the start of this one, where onnxruntime's executor fetches the node's inputs,
allocates its outputs and releases the previous node's (and where the profiler records its own
events). Both parts are reported (`kernel_us`, `dispatch_us`); what is left of the step is the
run's own setup before the first kernel and after the last (binding inputs, returning outputs).
The profiled step is slower than an unprofiled one (`unprofiled_step_us`, measured first): the
profiler's cost lands mostly in the dispatch part.

Bytes read per op: each kernel's non-constant inputs (onnxruntime's `activation_size`) plus the
initializers the node reads (sizes from the graph: onnxruntime frees weights it prepacks), except
that a Gather (embedding lookup) counts the rows it returns, and GroupQueryAttention's KV buffers
count only the rows the step attends to (the bound buffers are larger). GB/s is those bytes over
the op's kernel time, set against the machine's read bandwidth measured in the same run
(`measure_read_bandwidth`: the best of a ReduceSum and a matrix-vector product over buffers much
larger than the caches, same thread count).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmir_core import tracing
from llmir_core.errors import InputError

PROFILE_SCHEMA = 1
_NODE_NAME = re.compile(r"^(n\d+_[A-Za-z0-9]+(?:__\d+)?)")


@dataclass
class OpTime:
    """One .llmir op's time in a phase (summed over its nodes; per step for decode)."""

    op: str
    line: str  # "LINE:COL" in the source .llmir, "" when unknown
    loc: str
    us: float = 0.0  # kernel_us + dispatch_us
    bytes: float = 0.0
    nodes: dict[str, int] = field(default_factory=dict)  # onnxruntime op type -> kernels
    kernel_us: float = 0.0  # inside its kernels
    dispatch_us: float = 0.0  # between the previous kernel's end and its kernels' starts

    def to_json(
        self, step_us: float, bandwidth_gbs: float | None, file: str | None
    ) -> dict[str, Any]:
        gbs = self.bytes / (self.kernel_us * 1e3) if self.kernel_us > 0 else 0.0
        return {
            "op": self.op,
            "file": file,
            "line": int(self.line.split(":")[0]) if self.line else None,
            "col": int(self.line.split(":")[1]) if ":" in self.line else None,
            "loc": self.loc,
            "us": round(self.us, 3),
            "kernel_us": round(self.kernel_us, 3),
            "dispatch_us": round(self.dispatch_us, 3),
            "share": self.us / step_us if step_us > 0 else 0.0,
            "bytes": int(self.bytes),
            "gb_per_s": round(gbs, 3),
            "bandwidth_share": gbs / bandwidth_gbs if bandwidth_gbs else None,
            "kernels": dict(sorted(self.nodes.items())),
        }


@dataclass
class Phase:
    """Prefill (one run of prompt_len tokens) or decode (mean of one-token steps)."""

    name: str
    tokens: int
    steps: int
    step_us: float = 0.0  # onnxruntime model_run wall time per step
    kernel_us: float = 0.0  # all kernels per step
    dispatch_us: float = 0.0  # between kernels (attributed to the op whose kernel follows)
    unprofiled_step_us: float | None = None  # the same step without the profiler
    ops: dict[tuple[str, str, str], OpTime] = field(default_factory=dict)
    unmapped: dict[str, float] = field(default_factory=dict)  # node name -> us per step

    @property
    def attributed_us(self) -> float:
        return sum(o.us for o in self.ops.values())

    def ranked(self) -> list[OpTime]:
        return sorted(self.ops.values(), key=lambda o: -o.us)

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for o in self.ops.values():
            out[o.op] = out.get(o.op, 0.0) + o.us
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def to_json(
        self, bandwidth_gbs: float | None, file: str | None, top: int | None = None
    ) -> dict[str, Any]:
        ops = self.ranked()
        total_bytes = sum(o.bytes for o in ops)
        return {
            "tokens": self.tokens,
            "steps": self.steps,
            "step_us": round(self.step_us, 3),
            "unprofiled_step_us": (
                round(self.unprofiled_step_us, 3) if self.unprofiled_step_us else None
            ),
            "kernel_us": round(self.kernel_us, 3),
            "dispatch_us": round(self.dispatch_us, 3),
            "kernel_share": self.kernel_us / self.step_us if self.step_us else 0.0,
            "dispatch_share": self.dispatch_us / self.step_us if self.step_us else 0.0,
            "attributed_us": round(self.attributed_us, 3),
            "attributed_share": self.attributed_us / self.step_us if self.step_us else 0.0,
            "kernel_coverage": (
                sum(o.kernel_us for o in ops) / self.kernel_us if self.kernel_us else 0.0
            ),
            "bytes": int(total_bytes),
            "gb_per_s": round(total_bytes / (self.step_us * 1e3), 3) if self.step_us else 0.0,
            "kernel_gb_per_s": (
                round(total_bytes / (self.kernel_us * 1e3), 3) if self.kernel_us else 0.0
            ),
            "by_op_kind": {
                k: {"us": round(v, 3), "share": v / self.step_us if self.step_us else 0.0}
                for k, v in self.by_kind().items()
            },
            "ops": [
                o.to_json(self.step_us, bandwidth_gbs, file) for o in (ops[:top] if top else ops)
            ],
            "unmapped": {
                k: round(v, 3) for k, v in sorted(self.unmapped.items(), key=lambda kv: -kv[1])
            },
        }


@dataclass
class ProfileResult:
    artifact: str
    source: str | None  # the .llmir file of the ops' lines (manifest `lowered`, else source.file)
    threads: int
    bandwidth_gbs: float | None
    phases: list[Phase]
    fingerprint: dict[str, Any] = field(default_factory=dict)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        return {
            "profile_schema": PROFILE_SCHEMA,
            "artifact": self.artifact,
            "source": self.source,
            "threads": self.threads,
            "read_bandwidth_gb_per_s": self.bandwidth_gbs,
            "phases": {
                p.name: p.to_json(self.bandwidth_gbs, self.source, top) for p in self.phases
            },
            "fingerprint": self.fingerprint,
        }


# -- bandwidth ---------------------------------------------------------------------------------


def measure_read_bandwidth(threads: int, mbytes: int = 256, repeats: int = 5) -> float | None:
    """GB/s this machine reads memory at: the best of `repeats` runs of two onnxruntime graphs
    over a `mbytes` f32 buffer (much larger than the caches), each on `threads` threads: a
    ReduceSum and a matrix-vector product (MLAS's GEMV, the access pattern of a decode step's
    weight stream). The faster of the two counts: either may fall short of the bus."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    n = mbytes * (1 << 20) // 4
    k = 4096
    f32 = TensorProto.FLOAT

    def session(node: Any, ins: list[Any], out: Any) -> Any:
        g = helper.make_graph([node], "bw", ins, [out])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 9
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        return ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )

    x = np.ones(n, np.float32)
    reduce = session(
        helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0),
        [helper.make_tensor_value_info("x", f32, [n])],
        helper.make_tensor_value_info("y", f32, []),
    )
    gemv = session(
        helper.make_node("MatMul", ["a", "w"], ["y"]),
        [
            helper.make_tensor_value_info("a", f32, [1, k]),
            helper.make_tensor_value_info("w", f32, [k, n // k]),
        ],
        helper.make_tensor_value_info("y", f32, [1, n // k]),
    )
    feeds = [(reduce, {"x": x}), (gemv, {"a": np.ones((1, k), np.float32), "w": x.reshape(k, -1)})]
    best = float("inf")
    for sess, feed in feeds:
        sess.run(None, feed)
    for _ in range(repeats):
        for sess, feed in feeds:  # interleaved: a drifting machine affects both alike
            t0 = time.perf_counter()
            sess.run(None, feed)
            best = min(best, time.perf_counter() - t0)
    return x.nbytes / best / 1e9


# -- the profile -------------------------------------------------------------------------------


def _shape_bytes(entry: dict[str, list[int]]) -> int:
    ((dt, shape),) = entry.items()
    size = {
        "float": 4,
        "float16": 2,
        "bfloat16": 2,
        "int64": 8,
        "int32": 4,
        "int8": 1,
        "uint8": 1,
        "double": 8,
        "bool": 1,
    }.get(dt, 4)
    return int(np.prod(shape, dtype=np.int64)) * size if shape else size


def initializer_bytes(model: Any) -> dict[str, int]:
    """node name -> bytes of the initializers (weights) it reads, from the graph (no data loaded)."""
    from onnx import helper

    sizes = {}
    for t in model.graph.initializer:
        item = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        sizes[t.name] = int(np.prod(list(t.dims), dtype=np.int64)) * item
    return {nd.name: sum(sizes.get(i, 0) for i in set(nd.input)) for nd in model.graph.node}


def _kernel_bytes(args: dict[str, Any], context: int, weights: int) -> float:
    # onnxruntime's parameter_size misses weights it prepacked (and freed): take them from the graph
    if str(args.get("op_name", "")).startswith(
        "Gather"
    ):  # an embedding lookup reads the rows it returns
        return float(args.get("activation_size", 0)) + float(args.get("output_size", 0))
    read = float(args.get("activation_size", 0)) + weights
    if args.get("op_name") == "GroupQueryAttention":
        for ent in args.get("input_type_shape") or []:
            ((dt, shape),) = ent.items()
            if len(shape) == 4 and shape[2] > 0:  # a bound KV buffer: only `context` rows are read
                full = _shape_bytes(ent)
                read -= full - full * min(context, shape[2]) / shape[2]
    return read


class _Mapper:
    def __init__(self, sources: dict[str, dict[str, str]], weights: dict[str, int]) -> None:
        self.sources = sources
        self.weights = weights

    def key(self, node: str) -> str | None:
        if node in self.sources:
            return node
        m = _NODE_NAME.match(node)  # a node onnxruntime renamed or split keeps our name as a prefix
        return m.group(1) if m and m.group(1) in self.sources else None


def _phase(
    name: str,
    runs: list[dict[str, Any]],
    kernels: list[dict[str, Any]],
    mapper: _Mapper,
    tokens: int,
    contexts: list[int],
) -> Phase:
    ph = Phase(name, tokens, len(runs))
    n = len(runs)
    for run, ctx in zip(runs, contexts):
        t0, t1 = run["ts"], run["ts"] + run["dur"]
        ph.step_us += run["dur"] / n
        prev_end: float | None = None  # the end of the run's previous kernel
        for k in sorted((k for k in kernels if t0 <= k["ts"] <= t1), key=lambda k: k["ts"]):
            us = k["dur"] / n
            gap = max(0.0, k["ts"] - prev_end) / n if prev_end is not None else 0.0
            prev_end = max(prev_end or 0.0, k["ts"] + k["dur"])
            ph.kernel_us += us
            ph.dispatch_us += gap
            node = k["name"][: -len("_kernel_time")]
            found = mapper.key(node)
            if found is None:
                ph.unmapped[node] = ph.unmapped.get(node, 0.0) + us + gap
                continue
            src = mapper.sources[found]
            key = (src["line"], src["op"], src["loc"])
            o = ph.ops.get(key)
            if o is None:
                o = ph.ops[key] = OpTime(src["op"], src["line"], src["loc"])
            o.us += us + gap
            o.kernel_us += us
            o.dispatch_us += gap
            o.bytes += (
                _kernel_bytes(
                    k["args"], ctx, mapper.weights.get(node, mapper.weights.get(found, 0))
                )
                / n
            )
            if run is runs[0]:
                typ = k["args"].get("op_name", "?")
                o.nodes[typ] = o.nodes.get(typ, 0) + 1
    return ph


def _profiled(res: ProfileResult) -> dict[str, Any]:
    dec = res.phase("decode")
    return {
        "llmir.threads": res.threads,
        "llmir.read_bandwidth_gb_per_s": res.bandwidth_gbs,
        "llmir.decode.step_us": dec.step_us,
        "llmir.decode.attributed_share": dec.attributed_us / dec.step_us if dec.step_us else None,
        "llmir.prefill.step_us": res.phase("prefill").step_us,
    }


@tracing.traced("profile", after=_profiled)
def profile_artifact(
    art_dir: str,
    *,
    prompt_len: int = 128,
    decode_steps: int = 16,
    threads: int | None = None,
    seed: int = 0,
    warmup_steps: int = 4,
    measure_bandwidth: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ProfileResult:
    """Profile one prefill of prompt_len random tokens and decode_steps decode steps, on a
    runner that offers onnxruntime's profiler (`profile_sources`, `start_profiling`)."""
    from llmir_core.runtime.bench import hardware_fingerprint
    from llmir_core.targets import open_artifact

    for flag, v in (("--prompt-len", prompt_len), ("--profile-steps", decode_steps)):
        if v < 1:
            raise InputError(f"{flag} must be >= 1, got {v}")
    dec = open_artifact(art_dir, threads=threads)
    if not hasattr(dec, "start_profiling"):
        raise InputError(
            f"{art_dir}: profiling needs an onnxruntime decoder artifact "
            f"(this one is a {dec.manifest.get('target')} "
            f"{'decoder' if isinstance(dec.manifest.get('decoder'), dict) else 'tensor model'})",
            hint="build an imported LLM with `llmir build MODEL.llmir --target onnxruntime`",
        )
    need = prompt_len + warmup_steps + decode_steps + 1
    if dec.max_context is not None and need > dec.max_context:
        raise InputError(
            f"--prompt-len + profiled steps = {need} exceeds the model's context of {dec.max_context}"
        )
    graph, sources = dec.profile_sources()
    if not sources:
        raise InputError(
            f"{art_dir}: its ONNX nodes do not name the .llmir ops they come from",
            hint="rebuild the artifact with this llmir version (`llmir build`)",
        )
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, dec.vocab, size=(1, prompt_len), dtype=np.int64)
    dec.reserve(need)
    if progress:
        progress("timing the steps without the profiler")
    plain = _timed_runs(dec, ids, warmup_steps, decode_steps)
    runs, kernels = _profiled_runs(dec, ids, warmup_steps, decode_steps, progress)
    mapper = _Mapper(sources, initializer_bytes(graph))
    measured = runs[1 + warmup_steps :]
    prefill = _phase("prefill", measured[:1], kernels, mapper, prompt_len, [prompt_len])
    decode = _phase(
        "decode",
        measured[1:],
        kernels,
        mapper,
        1,
        [prompt_len + 1 + i for i in range(decode_steps)],
    )
    prefill.unprofiled_step_us, decode.unprofiled_step_us = plain
    bw = None
    if measure_bandwidth:
        if progress:
            progress("measuring read bandwidth")
        bw = measure_read_bandwidth(dec.threads)
    # the file the nodes' llmir.line tags point into: the lowered module the build wrote into the
    # artifact, else (an artifact without one, e.g. a generic build) the module's own file
    src = dec.manifest.get("lowered") or (dec.manifest.get("source") or {}).get("file")
    fp = {
        **hardware_fingerprint(),
        "artifact": os.path.basename(os.path.abspath(art_dir)),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    return ProfileResult(os.path.abspath(art_dir), src, dec.threads, bw, [prefill, decode], fp)


def _profiled_runs(
    dec: Any,
    ids: np.ndarray,
    warmup: int,
    steps: int,
    progress: Callable[[str], None] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`_timed_runs` again on a session with onnxruntime's profiler on: the profile's
    `model_run` events (in time order) and its kernel events."""
    with tempfile.TemporaryDirectory(prefix="llmir-profile-") as tmp:
        # the same decoder (I/O binding, shared KV buffers), on a session that profiles
        dec.start_profiling(os.path.join(tmp, "ort"))
        if progress:
            progress(f"profiling a {ids.shape[1]}-token prefill and {steps} decode steps")
        _timed_runs(dec, ids, warmup, steps)  # the runs the profile records
        trace_file = dec.sess.end_profiling()
        with open(trace_file, encoding="utf-8") as fh:
            events = json.load(fh)
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    kernels = [
        e
        for e in events
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")
    ]
    if len(runs) != 2 + warmup + steps:
        raise InputError(
            f"onnxruntime's profile holds {len(runs)} runs, expected {2 + warmup + steps}"
        )
    return runs, kernels


def _timed_runs(dec: Any, ids: np.ndarray, warmup: int, steps: int) -> tuple[float, float]:
    """A warm-up run (prefill + `warmup` steps), then a measured prefill and `steps` decode
    steps: their (prefill us, mean decode step us), the wall time of the forward calls."""
    dec.reset(1)
    nxt = _greedy(dec.forward(ids))
    for _ in range(warmup):
        nxt = _greedy(dec.forward(nxt))
    dec.reset(1)
    t0 = time.perf_counter()
    logits = dec.forward(ids)
    t1 = time.perf_counter()
    nxt = _greedy(logits)
    t2 = time.perf_counter()
    for _ in range(steps):
        nxt = _greedy(dec.forward(nxt))
    return (t1 - t0) * 1e6, (time.perf_counter() - t2) * 1e6 / steps


def _greedy(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits[:, -1], axis=-1).astype(np.int64)[:, None]


def _coverage(ph: Phase) -> float:
    """The share of kernel time that maps to a named op."""
    return sum(o.kernel_us for o in ph.ops.values()) / ph.kernel_us if ph.kernel_us else 0.0


def _setup(ph: Phase) -> float:
    """The step's time outside kernels and the gaps between them (before the first kernel and
    after the last: binding inputs, returning outputs)."""
    return max(0.0, ph.step_us - ph.kernel_us - ph.dispatch_us)


def format_profile(res: ProfileResult, top: int = 15) -> str:
    """The text report: per phase, the top ops by share of the step with file:line and loc."""
    lines = []
    bw = f"{res.bandwidth_gbs:.1f} GB/s" if res.bandwidth_gbs else "not measured"
    lines.append(
        f"{res.artifact} (from {res.source or 'an unsaved module'}), {res.threads} threads, "
        f"read bandwidth {bw}"
    )
    for ph in res.phases:
        what = (
            f"prefill of {ph.tokens} tokens"
            if ph.name == "prefill"
            else f"decode step (mean of {ph.steps})"
        )
        total_bytes = sum(o.bytes for o in ph.ops.values())
        gbs = total_bytes / (ph.kernel_us * 1e3) if ph.kernel_us else 0.0
        plain = (
            f" ({ph.unprofiled_step_us / 1e3:.3f} ms without the profiler)"
            if ph.unprofiled_step_us
            else ""
        )
        lines.append("")
        lines.append(
            f"{what}: {ph.step_us / 1e3:.3f} ms{plain}: kernels {ph.kernel_us / ph.step_us:.1%} "
            f"({_coverage(ph):.1%} of it in named .llmir ops), dispatch between kernels "
            f"{ph.dispatch_us / ph.step_us:.1%} (charged to the next op), run setup "
            f"{_setup(ph) / ph.step_us:.1%}; {total_bytes / 1e6:.1f} MB read, "
            f"{gbs:.1f} GB/s in kernels"
            if ph.step_us
            else f"{what}: no time recorded"
        )
        lines.append(
            f"  {'share':>6} {'us':>9} {'disp us':>8} {'MB':>8} {'GB/s':>6} {'of bw':>6}  "
            f"{'op':<34} {'where':<18} loc"
        )
        for o in ph.ranked()[:top]:
            g = o.bytes / (o.kernel_us * 1e3) if o.kernel_us > 0 else 0.0
            of_bw = f"{g / res.bandwidth_gbs:.0%}" if res.bandwidth_gbs else "-"
            where = f"{res.source or '?'}:{o.line.split(':')[0]}" if o.line else "?"
            lines.append(
                f"  {o.us / ph.step_us:6.1%} {o.us:9.1f} {o.dispatch_us:8.1f} {o.bytes / 1e6:8.2f} "
                f"{g:6.1f} {of_bw:>6}  {o.op:<34} {where:<18} {o.loc}"
            )
        rest = len(ph.ops) - top
        if rest > 0:
            rest_us = sum(o.us for o in ph.ranked()[top:])
            lines.append(f"  {rest_us / ph.step_us:6.1%} {rest_us:9.1f}  ... {rest} more ops")
        kinds = ", ".join(f"{k} {v / ph.step_us:.1%}" for k, v in list(ph.by_kind().items())[:6])
        lines.append(f"  by op: {kinds}")
        if ph.unmapped:
            un = sum(ph.unmapped.values())
            lines.append(
                f"  {un / ph.step_us:.1%} in {len(ph.unmapped)} onnxruntime nodes not mapped to an op"
            )
    return "\n".join(lines) + "\n"


__all__ = [
    "profile_artifact",
    "format_profile",
    "measure_read_bandwidth",
    "initializer_bytes",
    "ProfileResult",
    "Phase",
    "OpTime",
    "PROFILE_SCHEMA",
]
