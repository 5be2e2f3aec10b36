"""llmir's grouped-query attention (ai.llmir GroupQueryAttention, llmir_core/backends/ort_ext/
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

    python benchmarks/attention_kernels.py                      # both shapes, 1 thread
    python benchmarks/attention_kernels.py --threads 2 --format json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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


def _model(form: str, heads: int, kv: int, d: int, layers: int) -> bytes:
    from onnx import TensorProto, helper

    from llmir_core.backends.ort_ext import DOMAIN

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


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    from llmir_core.backends.ort_ext import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def bench(model: str, positions: int, new: int, threads: int, rounds: int, wall: bool) -> dict:  # type: ignore[type-arg]
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
    runs = {}
    for form in FORMS:
        sess = _session(_model(form, heads, kv, d, layers), threads)
        io = sess.io_binding()
        io.bind_output("o0")
        for k, v in feeds.items():
            io.bind_cpu_input(k, v)
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
    row: dict[str, Any] = {"model": model, "positions": positions, "new": new, "layers": layers}
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
    ap.add_argument("--format", choices=("text", "json"), default="text")
    a = ap.parse_args()
    cases = [(int(p), 1) for p in a.positions.split(",") if p] + (
        [(0, a.prefill)] if a.prefill else []
    )
    rows = []
    for model in a.models.split(","):
        for positions, new in cases:
            r = bench(model, positions, new, a.threads, a.rounds, a.wall)
            rows.append(r)
            if a.format == "text":
                what = f"decode @{positions:5}" if new == 1 else f"prefill {new:4}  "
                print(
                    f"{model:8} {what}: onnxruntime {r['onnxruntime_us']:8.1f} us | llmir "
                    f"{r['llmir_us']:8.1f} us | x{r['speedup']:.2f} (err {r['err']:.1e})",
                    flush=True,
                )
    if a.format == "json":
        doc = {"threads": a.threads, "clock": "cpu" if a.threads == 1 and not a.wall else "wall"}
        doc["loadavg"] = os.getloadavg()[0]
        print(json.dumps({**doc, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
