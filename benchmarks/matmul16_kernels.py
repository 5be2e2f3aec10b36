"""llmir's own matmul custom ops (ai.llmir MatMulF16 / MatMulBf16 / MatMulF32) against the
onnxruntime op they replace (com.microsoft FusedMatMul transB on f32 weights, MLAS, prepacked at
session creation), one node shape at a time, same random weights:

    ort-f32   FusedMatMul(x, W f32 [N, K], transB)   onnxruntime MLAS (the f32 build's op)
    f32       ai.llmir MatMulF32(x, W f32)            weights read in place
    f16       ai.llmir MatMulF16(x, W f16)            F16C widening in registers
    bf16      ai.llmir MatMulBf16(x, W bf16)          shift widening in registers

Shapes are the projections of SmolLM2-135M (K=576: N=576/960/1536/49152; K=1536: N=576) and
Qwen2.5-0.5B (K=896: N=896/1152/4864/151936; K=4864: N=896). A decode-shaped (M <= 8) model holds
as many copies of the node (distinct weights, one shared x) as it takes to read more than
--gemv-mb MB per run, so the weights stream from memory as in a real decode step, not from the
last-level cache. Prefill is M = 128. Forms are timed interleaved round by round (best of
--rounds; wall time with --threads > 1, the thread's CPU time with --threads 1, which a busy
machine disturbs least); GB/s is weight bytes read per second; ratios are against
ort-f32 (time of ort-f32 / time of the form: > 1 is faster) and, for prefill, GFLOP/s.

    python benchmarks/matmul16_kernels.py --model smollm2 --rounds 5
    python benchmarks/matmul16_kernels.py --model qwen --m 1 --forms ort-f32,f16
    python benchmarks/matmul16_kernels.py --forms f16 --isa avx2,avx512 --m 1,2,8,16 --threads 1

`--isa avx2,avx512` times each llmir form under each kernel variant (isa.h; `f16@avx2`,
`f16@avx512`), switched between runs in the one process (LLMIR_KERNEL_ISA, then the library's
llmir_isa_select: the library is loaded once, so every session sees the switch); a decode-shaped
model is one with M <= 16 here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "smollm2": [(576, 576), (576, 960), (576, 1536), (1536, 576), (576, 49152)],
    "qwen": [(896, 896), (896, 1152), (896, 4864), (4864, 896), (896, 151936)],
}
FORMS = ("ort-f32", "f32", "f16", "bf16")
BYTES = {"ort-f32": 4, "f32": 4, "f16": 2, "bf16": 2}


def _weight(form: str, name: str, w: np.ndarray) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    if form in ("ort-f32", "f32"):
        return numpy_helper.from_array(w, name)
    if form == "f16":
        return numpy_helper.from_array(w.astype(np.float16), name)
    bits = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    return helper.make_tensor(name, TensorProto.BFLOAT16, w.shape, bits.tobytes(), raw=True)


def model(form: str, k: int, n: int, copies: int, seed: int) -> bytes:
    from onnx import TensorProto, helper

    from llmir_core.targets.onnxruntime.native import DOMAIN

    op = {"ort-f32": "FusedMatMul", "f32": "MatMulF32", "f16": "MatMulF16", "bf16": "MatMulBf16"}
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []
    for c in range(copies):
        w = (rng.standard_normal((n, k), dtype=np.float32) * 0.05).astype(np.float32)
        inits.append(_weight(form, f"w{c}", w))
        attrs = {"transB": 1} if form == "ort-f32" else {}
        dom = "com.microsoft" if form == "ort-f32" else DOMAIN
        nodes.append(helper.make_node(op[form], ["x", f"w{c}"], [f"y{c}"], domain=dom, **attrs))
        outs.append(helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])], outs, inits
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    if form != "ort-f32":
        opsets.append(helper.make_opsetid(DOMAIN, 1))
    return helper.make_model(g, opset_imports=opsets).SerializeToString()


def session(form: str, blob: bytes, threads: int) -> Any:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.native import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if form != "ort-f32":
        register(so, ["llmir_ops"])
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def select_isa(isa: str) -> None:
    """Switch llmir's kernels to variant isa ("" leaves the choice as registered)."""
    import ctypes
    import os

    from llmir_core.targets.onnxruntime.native import library_path

    if not isa:
        return
    os.environ["LLMIR_KERNEL_ISA"] = isa
    lib = ctypes.CDLL(library_path())  # the handle onnxruntime loaded: one llmir_isa() for both
    lib.llmir_isa_select.restype = ctypes.c_char_p
    why = lib.llmir_isa_select()
    if why:
        raise SystemExit(why.decode())


def bench_shape(args: argparse.Namespace, k: int, n: int, m: int) -> dict[str, Any]:
    base_forms = [f for f in args.forms.split(",") if f]
    isas = [i for i in args.isa.split(",") if i]
    # each llmir form under each variant ("f16@avx2"); onnxruntime's own once
    forms = [f"{f}@{i}" if f != "ort-f32" else f for f in base_forms for i in (isas or [""])]
    forms = list(dict.fromkeys(f.rstrip("@") for f in forms))
    per = n * k * 2  # f16 bytes of one copy
    copies = 1 if m > 16 else max(1, min(64, int(args.gemv_mb * 1e6 / per) + 1))
    x = np.random.default_rng(7).standard_normal((m, k)).astype(np.float32)
    sess, load = {}, {}
    for f in forms:
        blob = model(f.split("@")[0], k, n, copies, seed=n * 31 + k)
        t = time.perf_counter()
        sess[f] = session(f.split("@")[0], blob, args.threads)
        load[f] = time.perf_counter() - t
        del blob

    def run(f: str) -> Any:
        select_isa(f.split("@")[1] if "@" in f else "")
        return sess[f].run(None, {"x": x})

    outs = {f: run(f)[0] for f in forms}  # warm up, and check agreement
    ref = outs[forms[0]]
    err = {f: float(np.abs(outs[f] - ref).max() / (np.abs(ref).max() + 1e-30)) for f in forms}
    times: dict[str, list[float]] = {f: [] for f in forms}
    # one thread: the thread's CPU time (waits for memory count, time other processes hold the
    # core does not); several: wall time
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    for _ in range(args.rounds):
        for f in forms:
            select_isa(f.split("@")[1] if "@" in f else "")
            t = clock()
            sess[f].run(None, {"x": x})
            times[f].append((clock() - t) / copies)
    # best of rounds (least disturbed by other load), or their median
    pick = statistics.median if args.median else min
    med = {f: pick(v) for f, v in times.items()}
    base = med.get("ort-f32", med[forms[0]])
    rows = []
    for f in forms:
        s = med[f]
        rows.append(
            {
                "form": f,
                "us": s * 1e6,
                "gbs": n * k * BYTES[f.split("@")[0]] / s / 1e9,
                "gflops": 2.0 * m * n * k / s / 1e9,
                "vs_ort": base / s,
                "load_ms": load[f] * 1e3,
                "rel_err": err[f],
            }
        )
    return {"k": k, "n": n, "m": m, "copies": copies, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=[*SHAPES, "all"], default="smollm2")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--m", default="1,128", help="rows of x, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gemv-mb", type=float, default=48.0, help="f16 MB per decode-shaped run")
    ap.add_argument("--shapes", default="", help="KxN,KxN to override the model's shapes")
    ap.add_argument("--isa", default="", help="kernel variants to compare, e.g. avx2,avx512")
    ap.add_argument("--median", action="store_true", help="median of rounds (default: best)")
    args = ap.parse_args()
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    else:
        names = list(SHAPES) if args.model == "all" else [args.model]
        shapes = [s for name in names for s in SHAPES[name]]
    print(f"threads {args.threads}, rounds {args.rounds}, loadavg {_loadavg()}")
    for m in (int(v) for v in args.m.split(",")):
        for k, n in shapes:
            r = bench_shape(args, k, n, m)
            head = f"M={m:<4d} K={k:<5d} N={n:<6d}"
            cells = []
            for row in r["rows"]:
                speed = f"{row['gbs']:5.1f} GB/s" if m <= 2 else f"{row['gflops']:6.1f} GF/s"
                cells.append(f"{row['form']}: {row['us']:8.1f} us {speed} x{row['vs_ort']:.2f}")
            print(head + "  " + " | ".join(cells), flush=True)
    return 0


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
