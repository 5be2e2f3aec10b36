"""The first half of a gated MLP on llmir's f32 and 16-bit kernels: one node with the SwiGLU
epilogue over [W_gate; W_up] against the op-by-op form it replaces, same random weights:

    fused    ai.llmir MatMulF32 {N, epilogue = "swiglu"} (panels) / MatMulF16 {epilogue}
    unfused  gate and up MatMulF32 / MatMulF16, com.microsoft QuickGelu (alpha 1), Mul

(`llmir build` without / with the `swiglu = false` option). Shapes: SmolLM2-135M (K = 576,
H = 1536) and Qwen2.5-0.5B (K = 896, H = 4864). A decode-shaped (M <= 8) model holds as many
copies of the MLP half (distinct weights, one shared x) as it takes to read more than --gemv-mb MB
per run, so the weights stream from memory as in a real decode step. The forms are timed
interleaved round by round, best of --rounds (with --threads 1 the thread's CPU time, which a busy
machine disturbs least; else wall time); the ratio is unfused time / fused time (> 1: the fused
node is faster).

    python benchmarks/swiglu_float_kernels.py --threads 1 --rounds 20
    python benchmarks/swiglu_float_kernels.py --model qwen --dtypes f16 --m 1,128
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {"smollm2": (576, 1536), "qwen": (896, 4864)}  # (K, H)


def model(dtype: str, fused: bool, k: int, h: int, copies: int, seed: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    from llmir_core.targets.onnxruntime.native import DOMAIN
    from llmir_core.targets.onnxruntime.panels import to_panels

    op = "MatMulF32" if dtype == "f32" else "MatMulF16"

    def weight(name: str, w: np.ndarray) -> tuple[Any, dict[str, Any]]:
        if dtype == "f32":
            return numpy_helper.from_array(to_panels(w), name), {"N": w.shape[0]}
        return numpy_helper.from_array(w.astype(np.float16), name), {}

    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []
    for c in range(copies):
        w = (rng.standard_normal((2 * h, k), dtype=np.float32) * 0.05).astype(np.float32)
        y = f"y{c}"
        if fused:
            t, at = weight(f"w{c}", w)
            inits.append(t)
            nodes.append(
                helper.make_node(op, ["x", f"w{c}"], [y], domain=DOMAIN, epilogue="swiglu", **at)
            )
        else:
            for part, rows in (("g", w[:h]), ("u", w[h:])):
                t, at = weight(f"{part}{c}", rows)
                inits.append(t)
                nodes.append(
                    helper.make_node(op, ["x", f"{part}{c}"], [f"{part}y{c}"], domain=DOMAIN, **at)
                )
            nodes.append(
                helper.make_node(
                    "QuickGelu", [f"gy{c}"], [f"s{c}"], domain="com.microsoft", alpha=1.0
                )
            )
            nodes.append(helper.make_node("Mul", [f"s{c}", f"uy{c}"], [y]))
        outs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        outs,
        inits,
    )
    opsets = [
        helper.make_opsetid("", 21),
        helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(DOMAIN, 1),
    ]
    return helper.make_model(g, opset_imports=opsets).SerializeToString()


def session(blob: bytes, threads: int) -> Any:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.native import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    register(so, ["llmir_ops"])
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def bench(args: argparse.Namespace, dtype: str, k: int, h: int, m: int) -> str:
    per = 2 * h * k * (4 if dtype == "f32" else 2)
    copies = 1 if m > 8 else max(1, min(64, int(args.gemv_mb * 1e6 / per) + 1))
    sess = {
        f: session(model(dtype, f == "fused", k, h, copies, seed=h + k), args.threads)
        for f in (("unfused", "fused") if args.unfused_first else ("fused", "unfused"))
    }
    x = np.random.default_rng(7).standard_normal((m, k)).astype(np.float32)
    outs = {f: s.run(None, {"x": x})[0] for f, s in sess.items()}  # warm up, and compare
    ref = outs["unfused"]
    err = float(np.abs(outs["fused"] - ref).max() / (np.abs(ref).max() + 1e-30))
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    times: dict[str, list[float]] = {f: [] for f in sess}
    for r in range(args.rounds):
        for f in ("fused", "unfused") if r % 2 else ("unfused", "fused"):
            t = clock()
            sess[f].run(None, {"x": x})
            times[f].append((clock() - t) / copies)
    best = {f: min(v) for f, v in times.items()}
    return (
        f"{dtype} M={m:<4d} K={k:<4d} H={h:<5d} fused {best['fused'] * 1e6:8.1f} us | unfused "
        f"{best['unfused'] * 1e6:8.1f} us | x{best['unfused'] / best['fused']:.3f} "
        f"(rel diff {err:.1e}, {copies} copies)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=[*SHAPES, "all"], default="all")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--m", default="1", help="rows of x, comma-separated")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--unfused-first", action="store_true", help="create the unfused session first")
    ap.add_argument("--gemv-mb", type=float, default=64.0, help="weight MB per decode-shaped run")
    args = ap.parse_args()
    names = list(SHAPES) if args.model == "all" else [args.model]
    print(f"threads {args.threads}, rounds {args.rounds}, loadavg {_loadavg()}", flush=True)
    for dtype in args.dtypes.split(","):
        for m in (int(v) for v in args.m.split(",")):
            for name in names:
                print(bench(args, dtype, *SHAPES[name], m), flush=True)
    print(f"loadavg {_loadavg()}")
    return 0


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split(" ", 3)[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
