"""llmir's int8 matmul (ai.llmir MatMulS8, llmir_core/targets/onnxruntime/native/matmul_s8.c) against the
onnxruntime ops it can replace, one op per model, same random weights, interleaved round by round:

    s8        ai.llmir MatMulS8: int8 [N, K] per-row scales, read in place (no prepacking)
    dq        com.microsoft.DynamicQuantizeMatMul, s8pair codes (MLAS QGEMM, prepacked at load)
    nb8       com.microsoft.MatMulNBits bits=8 block 32 accuracy_level 4 (prepacked at load)

For each shape (SmolLM2-135M and Qwen2.5-0.5B projections) and M (1 = a decode step, 128 = a
prefill) it reports the median time, the effective weight bandwidth (int8 code bytes / time:
each model holds enough copies of the weight, all fed the same X, to exceed the CPU caches),
the ratio to s8, and the max error against the f32 product (relative to max|y|), plus the load
time (session creation) per form.

    python benchmarks/s8_kernels.py --rounds 5
    python benchmarks/s8_kernels.py --shapes 576x576,49152x576 --m 1 --format json

--accuracy F32_ARTIFACT ARTIFACT... instead compares built decoders with an f32 one over a
128-token random prompt and 128 greedy tokens: the max |logit difference| (prefill's last
position and every teacher-forced decode step), the teacher-forced greedy agreement, and the
length of the identical prefix when each runs free.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = (  # N x K
    "576x576",
    "960x576",
    "1536x576",
    "576x1536",
    "49152x576",
    "896x896",
    "1152x896",
    "4864x896",
    "896x4864",
    "151936x896",
)
FORMS = ("s8", "dq", "nb8")
MIN_BYTES = 96 << 20  # int8 weight bytes per model (beyond the last-level cache)


def _model(form: str, n: int, k: int, w: np.ndarray, copies: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    from llmir_core.quant import nbits, qgemm, s8
    from llmir_core.targets.onnxruntime.native import DOMAIN

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])
    if form == "s8":
        q, sc = s8.quantize_rows(w)
    elif form == "dq":
        q, sc = qgemm.quantize_rows(w, pairs=True)
    else:
        codes, scales, _ = nbits.quantize(w, 8, 32, True, np.dtype(np.float32))
        q, sc = codes.reshape(n, k // 32, 32), scales.reshape(-1)
    inits: list[Any] = []
    nodes, outs = [], []
    for c in range(copies):  # distinct weights (rows rotated by c): each copy is read from memory
        qc, sc_c = np.roll(q, -c, axis=0), np.roll(sc, -c)
        if form == "s8":
            qc = s8.interleave(qc)
        elif form == "dq":
            qc = np.ascontiguousarray(qc.T)
        wn, sn, y = f"w{c}", f"s{c}", f"y{c}"
        inits += [numpy_helper.from_array(qc, wn), numpy_helper.from_array(sc_c, sn)]
        if form == "s8":
            nodes.append(helper.make_node("MatMulS8", ["x", wn, sn], [y], domain=DOMAIN))
        elif form == "dq":
            nodes.append(
                helper.make_node(
                    "DynamicQuantizeMatMul", ["x", wn, sn], [y], domain="com.microsoft"
                )
            )
        else:
            nodes.append(
                helper.make_node(
                    "MatMulNBits",
                    ["x", wn, sn],
                    [y],
                    domain="com.microsoft",
                    K=k,
                    N=n,
                    bits=8,
                    block_size=32,
                    accuracy_level=4,
                )
            )
        outs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, ["m", n]))
    g = helper.make_graph(nodes, "g", [x], outs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    if form == "s8":
        opsets.append(helper.make_opsetid(DOMAIN, 1))
    return helper.make_model(g, opset_imports=opsets).SerializeToString()  # type: ignore[no-any-return]


def _session(blob: bytes, threads: int) -> tuple[Any, float]:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.native import library_path

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(library_path())
    t = time.perf_counter()
    sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
    return sess, time.perf_counter() - t


def run(
    shapes: list[str], ms: list[int], rounds: int, threads: int, reps: int
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for shape in shapes:
        n, k = map(int, shape.split("x"))
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.02
        copies = max(1, -(-MIN_BYTES // (n * k)))
        sessions = {}
        loads = {}
        for f in FORMS:
            sessions[f], loads[f] = _session(_model(f, n, k, w, copies), threads)
        for m in ms:
            x = rng.standard_normal((m, k)).astype(np.float32)
            ref = x.astype(np.float64) @ w.astype(np.float64).T
            err = {}
            for f in FORMS:
                y = sessions[f].run(["y0"], {"x": x})[0]
                err[f] = float(np.abs(y - ref).max() / np.abs(ref).max())
            times: dict[str, list[float]] = {f: [] for f in FORMS}
            for _ in range(rounds):
                for f in FORMS:
                    t = time.perf_counter()
                    for _ in range(reps if m == 1 else 1):
                        sessions[f].run(None, {"x": x})
                    times[f].append((time.perf_counter() - t) / (reps if m == 1 else 1) / copies)
            med = {f: statistics.median(times[f]) for f in FORMS}
            row = {
                "shape": shape,
                "m": m,
                "ms": {f: med[f] * 1e3 for f in FORMS},
                "gbps": {f: n * k / med[f] / 1e9 for f in FORMS},
                "speedup_vs": {f: med[f] / med["s8"] for f in FORMS if f != "s8"},
                "rel_err": err,
                "load_s": loads,
            }
            rows.append(row)
            print(
                f"{shape:>11} M={m:<4} "
                + "  ".join(f"{f} {row['gbps'][f]:6.2f} GB/s" for f in FORMS)
                + "  s8 speedup: "
                + " ".join(f"{f} {row['speedup_vs'][f]:.2f}x" for f in FORMS if f != "s8")
                + "  err: "
                + " ".join(f"{f} {err[f]:.1e}" for f in FORMS),
                file=sys.stderr,
            )
        del sessions
    return rows


def accuracy(ref_dir: str, dirs: list[str], n: int, threads: int) -> list[dict[str, Any]]:
    from llmir_core.targets.onnxruntime.runner import open_decoder

    ref = open_decoder(ref_dir, threads=threads)
    prompt = np.random.default_rng(0).integers(3, min(ref.vocab, 1000), (1, 128))
    ref.reserve(128 + n)
    ref.reset(1)
    lr = [ref.forward(prompt)[0, -1]]
    toks: list[int] = []
    for _ in range(n):
        toks.append(int(lr[-1].argmax()))
        lr.append(ref.forward(np.asarray([[toks[-1]]]))[0, -1])
    rows = []
    for d in dirs:
        dec = open_decoder(d, threads=threads)
        dec.reserve(128 + n)
        dec.reset(1)
        la = [dec.forward(prompt)[0, -1]]
        for t in toks:  # teacher-forced: the f32 model's tokens
            la.append(dec.forward(np.asarray([[t]]))[0, -1])
        diff = max(float(np.abs(a - b).max()) for a, b in zip(la, lr))
        mean = float(np.mean([np.abs(a - b).mean() for a, b in zip(la, lr)]))
        forced = sum(int(a.argmax()) == t for a, t in zip(la[:-1], toks))
        dec.reset(1)
        lf = dec.forward(prompt)[0, -1]
        free = []
        for _ in range(n):
            free.append(int(lf.argmax()))
            lf = dec.forward(np.asarray([[free[-1]]]))[0, -1]
        same = next((i for i, (a, b) in enumerate(zip(toks, free)) if a != b), n)
        row = {
            "artifact": d,
            "max_logit_diff": diff,
            "mean_logit_diff": mean,
            "logit_range": float(max(np.ptp(x) for x in lr)),
            "teacher_forced_agree": forced,
            "free_running_identical_prefix": same,
            "tokens": n,
        }
        rows.append(row)
        print(
            f"{d}: max |logit diff| {diff:.3g}, mean {mean:.3g} (f32 logits span "
            f"{row['logit_range']:.3g}), "
            f"greedy agreement {forced}/{n} teacher-forced, identical prefix {same}/{n}",
            file=sys.stderr,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default=",".join(SHAPES), help="NxK,... (default: both models)")
    ap.add_argument("--m", default="1,128", help="rows of X, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5, help="runs per round at M=1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--format", choices=("text", "json"), default="text")
    ap.add_argument("--accuracy", nargs="+", metavar="ARTIFACT", help="F32_ARTIFACT ARTIFACT...")
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens (--accuracy)")
    a = ap.parse_args()
    if a.accuracy:
        if len(a.accuracy) < 2:
            print("error: --accuracy needs an f32 artifact and at least one other", file=sys.stderr)
            return 2
        acc = accuracy(a.accuracy[0], a.accuracy[1:], a.tokens, a.threads)
        print(json.dumps(acc, indent=1) if a.format == "json" else "")
        return 0
    try:
        shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
        ms = [int(v) for v in a.m.split(",")]
        for s in shapes:
            n, k = map(int, s.split("x"))
            if k % 32:
                raise ValueError(f"K = {k} of {s} is not a multiple of 32 (MatMulNBits block)")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = run(shapes, ms, a.rounds, a.threads, a.reps)
    if a.format == "json":
        print(json.dumps({"threads": a.threads, "rows": rows}, indent=1))
    else:
        for r in rows:
            print(
                f"{r['shape']}\tM={r['m']}\t"
                + "\t".join(f"{f}={r['gbps'][f]:.2f}GB/s" for f in FORMS)
                + "\t"
                + "\t".join(f"s8/{f}={r['speedup_vs'][f]:.2f}x" for f in r["speedup_vs"])
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
