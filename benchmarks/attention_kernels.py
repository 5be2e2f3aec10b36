"""llmir's grouped-query attention (ai.llmir GroupQueryAttention, llmir_core/targets/onnxruntime/native/
attention.c) against the onnxruntime op it replaces (com.microsoft GroupQueryAttention), one
head configuration at a time, on the same inputs, as llmir's decoder runs it: packed QKV, rotary
in the op at position_ids, past and present bound to one KV buffer per node.

Each form's model holds one node per decoder layer of the shape (30 for SmolLM2-135M, 24 for
Qwen2.5-0.5B), each over its own KV buffers of `positions` filled rows, all fed the same packed
QKV: a decode step (1 new token after `positions` cached ones) or a prefill (`--prefill` tokens
from an empty cache). The forms run interleaved round by round in one process; the time per node
is the minimum over rounds (the least disturbed one) of one run / layers: CPU time of the process
with --threads 1 (the default: a busy machine inflates wall time unevenly), wall time otherwise.
`err` is max |llmir - onnxruntime| over the attention outputs of the first node.

`--cold MB`: as in a real decode step, where each layer's weights stream through the caches
between two attention nodes, every node is preceded by a ReduceSumSquare over its own MB-byte
input, so the node reads its KV cache from memory; the time per node is then the median of the
attention nodes' own kernel times from onnxruntime's profiler (wall time, the same profiler
overhead for both forms).

    python benchmarks/attention_kernels.py                      # both shapes, 1 thread
    python benchmarks/attention_kernels.py --threads 2 --format json
    python benchmarks/attention_kernels.py --cold 3 --prefill 0    # decode, cache from memory
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {  # (num_heads, kv_num_heads, head_dim, layers)
    "smollm2": (9, 3, 64, 30),
    "qwen2.5": (14, 2, 64, 24),
}
FORMS = ("onnxruntime", "llmir")


def _model(form: str, heads: int, kv: int, d: int, layers: int, cold: int = 0) -> bytes:
    from onnx import TensorProto, helper

    from llmir_core.targets.onnxruntime.native import DOMAIN

    vi, f = helper.make_tensor_value_info, TensorProto.FLOAT
    inputs = [
        vi("qkv", f, ["B", "S", (heads + 2 * kv) * d]),
        vi("seqlens", TensorProto.INT32, ["B"]),
        vi("total", TensorProto.INT32, []),
        vi("cos", f, [None, d // 2]),
        vi("sin", f, [None, d // 2]),
        vi("pos", TensorProto.INT64, ["B", "S"]),
    ]
    nodes, outs = [], []
    for i in range(layers):
        if cold:  # read cold bytes first: the KV cache is evicted to memory
            inputs.append(vi(f"w{i}", f, [cold // 4]))
            nodes.append(helper.make_node("ReduceSumSquare", [f"w{i}"], [f"r{i}"], keepdims=0))
            outs.append(vi(f"r{i}", f, None))
        inputs += [vi(f"pk{i}", f, ["B", kv, "L", d]), vi(f"pv{i}", f, ["B", kv, "L", d])]
        ins = ["qkv", "", "", f"pk{i}", f"pv{i}", "seqlens", "total", "cos", "sin", "pos"]
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                ins,
                [f"o{i}", f"k{i}", f"v{i}"],
                domain=DOMAIN if form == "llmir" else "com.microsoft",
                num_heads=heads,
                kv_num_heads=kv,
                do_rotary=1,
                rotary_interleaved=0,
            )
        )
        outs += [vi(n, f, None) for n in (f"o{i}", f"k{i}", f"v{i}")]
    g = helper.make_graph(nodes, "gqa", inputs, outs)
    opsets = [helper.make_opsetid(x, 1) for x in ("com.microsoft", DOMAIN)]
    return helper.make_model(  # type: ignore[no-any-return]
        g, opset_imports=[helper.make_opsetid("", 21), *opsets]
    ).SerializeToString()


def _session(model: bytes, threads: int, profile: str = "") -> Any:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.native import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _node_times(sess: Any) -> list[float]:
    """The attention nodes' kernel times (seconds) in a profiled session's trace."""
    path = sess.end_profiling()
    try:
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh)
    finally:
        os.unlink(path)
    return [
        e["dur"] * 1e-6
        for e in events
        if e.get("cat") == "Node"
        and e.get("args", {}).get("op_name") == "GroupQueryAttention"
        and e["name"].endswith("_kernel_time")
    ]


def bench(
    model: str,
    positions: int,
    new: int,
    threads: int,
    rounds: int,
    wall: bool,
    cold: int = 0,
    tmp: str = "",
) -> dict:  # type: ignore[type-arg]
    import statistics

    import onnxruntime as ort

    heads, kv, d, layers = SHAPES[model]
    rng = np.random.default_rng(positions + new)
    cap = positions + new
    ang = np.arange(cap, dtype=np.float32)[:, None] * rng.random(d // 2, dtype=np.float32)
    feeds = {
        "qkv": rng.standard_normal((1, new, (heads + 2 * kv) * d)).astype(np.float32),
        "seqlens": np.array([cap - 1], np.int32),
        "total": np.array(cap, np.int32),
        "cos": np.cos(ang),
        "sin": np.sin(ang),
        "pos": np.arange(positions, cap, dtype=np.int64)[None],
    }
    bufs = [rng.standard_normal((1, kv, cap, d)).astype(np.float32) for _ in range(2 * layers)]
    flush = [
        rng.standard_normal(cold // 4).astype(np.float32) for _ in range(layers if cold else 0)
    ]
    runs = {}
    for form in FORMS:
        prof = os.path.join(tmp, f"attn-{form}") if cold else ""
        sess = _session(_model(form, heads, kv, d, layers, cold), threads, prof)
        io = sess.io_binding()
        io.bind_output("o0")
        for k, v in feeds.items():
            io.bind_cpu_input(k, v)
        for i, w in enumerate(flush):
            io.bind_cpu_input(f"w{i}", w)
            io.bind_output(f"r{i}")
        keep = []
        for i in range(layers):
            for j, name in enumerate("kv"):
                buf = bufs[2 * i + j].copy()  # the same cache for both forms
                val = ort.OrtValue.ortvalue_from_numpy(buf)
                keep.append((buf, val))
                io.bind_ortvalue_input(f"p{name}{i}", val)
                io.bind_ortvalue_output(f"{name}{i}", val)
        for i in range(1, layers):
            io.bind_output(f"o{i}")
        runs[form] = (sess, io, keep)
    out = {}
    for form, (sess, io, _) in runs.items():
        sess.run_with_iobinding(io)  # warm
        out[form] = io.copy_outputs_to_cpu()[0]
    clock = time.process_time if threads == 1 and not wall else time.perf_counter
    times: dict[str, list[float]] = {f: [] for f in FORMS}
    reps = max(1, 2048 // (positions + 16 * new))
    for _ in range(rounds):
        for form, (sess, io, _) in runs.items():
            t = clock()
            for _ in range(reps):
                sess.run_with_iobinding(io)
            times[form].append((clock() - t) / reps / layers)
    best = {f: min(v) for f, v in times.items()}
    if cold:  # the nodes' own times (the reads before them excluded)
        best = {f: statistics.median(_node_times(r[0])) for f, r in runs.items()}
    row: dict[str, Any] = {"model": model, "positions": positions, "new": new, "layers": layers}
    row["cold_bytes"] = cold
    for f in FORMS:
        row[f"{f}_us"] = best[f] * 1e6
    row["err"] = float(np.abs(out["llmir"] - out["onnxruntime"]).max())
    row["speedup"] = best["onnxruntime"] / best["llmir"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="smollm2,qwen2.5")
    ap.add_argument("--positions", default="128,512,2048", help="cached rows at a decode step")
    ap.add_argument("--prefill", type=int, default=128, help="prompt tokens (0: no prefill row)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall time (always with --threads > 1)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--cold", type=float, default=0.0, help="MB read before each node (0: caches warm)"
    )
    ap.add_argument("--format", choices=("text", "json"), default="text")
    a = ap.parse_args()
    cases = [(int(p), 1) for p in a.positions.split(",") if p] + (
        [(0, a.prefill)] if a.prefill else []
    )
    rows = []
    cold = int(a.cold * (1 << 20)) // 4 * 4
    tmp = tempfile.mkdtemp(prefix="attn-prof-")
    for model in a.models.split(","):
        for positions, new in cases:
            r = bench(model, positions, new, a.threads, a.rounds, a.wall, cold, tmp)
            rows.append(r)
            if a.format == "text":
                what = f"decode @{positions:5}" if new == 1 else f"prefill {new:4}  "
                print(
                    f"{model:8} {what}: onnxruntime {r['onnxruntime_us']:8.1f} us | llmir "
                    f"{r['llmir_us']:8.1f} us | x{r['speedup']:.2f} (err {r['err']:.1e})",
                    flush=True,
                )
    os.rmdir(tmp)
    if a.format == "json":
        clock = "cpu" if a.threads == 1 and not a.wall else "wall"
        doc = {"threads": a.threads, "clock": "profiler" if cold else clock, "cold_mb": a.cold}
        doc["loadavg"] = os.getloadavg()[0]
        print(json.dumps({**doc, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
