"""llmir's f32 matmul custom op (ai.llmir MatMulF32, llmir_core/targets/onnxruntime/native/matmul_f32.c)
against onnxruntime's MLAS on the same f32 weights, one node shape at a time:

    mlas      com.microsoft FusedMatMul(x, W [N, K], transB)   MLAS, B prepacked at session open
    matmul    MatMul(x, W^T [K, N])                            MLAS, B prepacked at session open
    panel16   ai.llmir MatMulF32(x, W [ceil(N/16), K, 16], N)  panels read in place (the default)
    rows      ai.llmir MatMulF32(x, W [N, K])                  rows read in place (tied tables)

Shapes are the projections of SmolLM2-135M (K=576: N=960 packed QKV, 576, 1536, 49152; K=1536: N=576) and
Qwen2.5-0.5B (K=896: N=1152 packed QKV, 896,
4864, 151936; K=4864: N=896). A decode-shaped (M <= 8) model holds
as many copies of the node (distinct weights, one shared x) as it takes to read more than
--gemv-mb MB per run, so weights stream from memory as in a decode step. Forms run interleaved
round by round (best of --rounds; wall time, or with --threads 1 the thread's CPU time, which a
busy machine disturbs least); GB/s is weight bytes read per second, GF/s for
prefill; `xR` is the time of `mlas` over the form's (> 1: faster than MLAS); load is session
creation (MLAS prepacks there).

    python benchmarks/f32_kernels.py --model smollm2 --m 1,128 --rounds 7
    python benchmarks/f32_kernels.py --shapes 576x1536 --m 1,8,128 --format json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "smollm2": [(576, 960), (576, 576), (576, 1536), (1536, 576), (576, 49152)],
    "qwen": [(896, 1152), (896, 896), (896, 4864), (4864, 896), (896, 151936)],
}
FORMS = ("mlas", "matmul", "panel16", "rows")


def model(form: str, k: int, n: int, copies: int, seed: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    from llmir_core.targets.onnxruntime.native import DOMAIN
    from llmir_core.targets.onnxruntime.panels import to_panels

    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []
    for c in range(copies):
        w = (rng.standard_normal((n, k), dtype=np.float32) * 0.05).astype(np.float32)
        wn, y = f"w{c}", f"y{c}"
        if form == "mlas":
            inits.append(numpy_helper.from_array(w, wn))
            node = helper.make_node("FusedMatMul", ["x", wn], [y], domain="com.microsoft", transB=1)
        elif form == "matmul":
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), wn))
            node = helper.make_node("MatMul", ["x", wn], [y])
        elif form == "panel16":
            inits.append(numpy_helper.from_array(to_panels(w), wn))
            node = helper.make_node("MatMulF32", ["x", wn], [y], domain=DOMAIN, N=n)
        else:
            inits.append(numpy_helper.from_array(w, wn))
            node = helper.make_node("MatMulF32", ["x", wn], [y], domain=DOMAIN)
        nodes.append(node)
        outs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])], outs, inits
    )
    opsets = [
        helper.make_opsetid("", 21),
        helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(DOMAIN, 1),
    ]
    return helper.make_model(g, opset_imports=opsets).SerializeToString()


def session(form: str, blob: bytes, threads: int) -> Any:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.native import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    register(so, ["llmir_ops"])
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def bench_shape(
    args: argparse.Namespace, forms: list[str], k: int, n: int, m: int
) -> dict[str, Any]:
    per = n * k * 4
    copies = 1 if m > 8 else max(1, min(64, int(args.gemv_mb * 1e6 / per) + 1))
    x = np.random.default_rng(7).standard_normal((m, k)).astype(np.float32)
    sess, load = {}, {}
    for f in forms:
        blob = model(f, k, n, copies, seed=n * 31 + k)
        t = time.perf_counter()
        sess[f] = session(f, blob, args.threads)
        load[f] = time.perf_counter() - t
        del blob
    outs = {f: sess[f].run(None, {"x": x})[0] for f in forms}  # warm up, check agreement
    ref = outs[forms[0]]
    err = {f: float(np.abs(outs[f] - ref).max() / (np.abs(ref).max() + 1e-30)) for f in forms}
    times: dict[str, list[float]] = {f: [] for f in forms}
    # one thread: the thread's CPU time (what other processes take of the core does not count);
    # several: wall time
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    for r in range(args.rounds):
        order = forms[r % len(forms) :] + forms[: r % len(forms)]  # rotate who goes first
        for f in order:
            t = clock()
            sess[f].run(None, {"x": x})
            times[f].append((clock() - t) / copies)
    best = {f: min(v) for f, v in times.items()}
    base = best.get("mlas", best[forms[0]])
    rows = [
        {
            "form": f,
            "us": best[f] * 1e6,
            "gbs": n * k * 4 / best[f] / 1e9,
            "gflops": 2.0 * m * n * k / best[f] / 1e9,
            "vs_mlas": base / best[f],
            "load_ms": load[f] * 1e3 / copies,
            "rel_err": err[f],
        }
        for f in forms
    ]
    return {"k": k, "n": n, "m": m, "copies": copies, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=[*SHAPES, "all"], default="all")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--m", default="1,128", help="rows of x, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gemv-mb", type=float, default=64.0, help="weight MB per decode-shaped run")
    ap.add_argument("--shapes", default="", help="KxN,KxN to override the model's shapes")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args()
    forms = [f for f in args.forms.split(",") if f]
    bad = [f for f in forms if f not in FORMS]
    if bad:
        print(f"error: unknown form '{bad[0]}' (use: {', '.join(FORMS)})", file=sys.stderr)
        return 2
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    else:
        names = list(SHAPES) if args.model == "all" else [args.model]
        shapes = [s for name in names for s in SHAPES[name]]
    results = []
    print(f"threads {args.threads}, rounds {args.rounds}, loadavg {_loadavg()}", file=sys.stderr)
    for m in (int(v) for v in args.m.split(",")):
        for k, n in shapes:
            r = bench_shape(args, forms, k, n, m)
            results.append(r)
            if args.format == "text":
                cells = []
                for row in r["rows"]:
                    speed = f"{row['gbs']:5.1f} GB/s" if m <= 8 else f"{row['gflops']:6.1f} GF/s"
                    cells.append(
                        f"{row['form']}: {row['us']:8.1f} us {speed} x{row['vs_mlas']:.2f}"
                        f" load {row['load_ms']:.1f} ms"
                    )
                print(f"M={m:<4d} K={k:<5d} N={n:<6d}  " + " | ".join(cells), flush=True)
    if args.format == "json":
        print(json.dumps({"threads": args.threads, "loadavg": _loadavg(), "results": results}))
    return 0


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
