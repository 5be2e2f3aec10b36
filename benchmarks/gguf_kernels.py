"""llmir's GGUF matmul (ai.llmir MatMulGGUF, llmir_core/targets/onnxruntime/native/matmul_gguf.c: the
blocks as the file stores them) against llmir's MatMulNBitsQ4 / Q8 (32-element blocks, f16
scales: what a requantized build runs) on the same shapes: decode (M = 1) and prefill (M = 128).

Each form's model holds COPIES nodes of one shape, each with its own random weights (together
past the last-level cache, so every decode step reads its weights from memory), all fed the same
X. The forms run interleaved round by round in one process; a form's time per node is the median
over rounds of one run / copies: wall time, or with --threads 1 the process's CPU time (a busy
machine inflates wall time unevenly). Ratios are time(form) / time(MatMulNBitsQ4): above
1 is slower than the requantized int4 kernel. K-quant formats need K % 256 == 0; shapes whose K
is not (Gemma 3's 640) time the 32-element formats a GGUF file falls back to instead.

    python benchmarks/gguf_kernels.py                          # default shapes, 2 threads
    python benchmarks/gguf_kernels.py --shape 2048x640 --m 1 --formats q4_k,q6_k --format json
    python benchmarks/gguf_kernels.py --decode --threads 1   # the Gemma file's shapes, M = 1..16,
                                                             # each kernel variant, x of M = 1
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

# (K, N): Gemma 3 270M ffn_down / ffn_up (K = 640: no K-quants), Qwen2 1.5B attention, Qwen2
# 0.5B ffn_down
SHAPES = [(2048, 640), (640, 2048), (1536, 1536), (4864, 896)]
K_FORMATS = ("q4_k", "q5_k", "q6_k")
SMALL_FORMATS = ("q5_0", "q8_0", "iq4_nl")  # 32-element blocks: any K % 32 == 0
NBITS = ("nbits_q4", "nbits_q8")
TARGET_BYTES = 40 << 20  # weights per model: past the last-level cache


def _weights(form: str, rng: np.random.Generator, n: int, k: int) -> list[np.ndarray]:
    if form.startswith("nbits"):
        bits = int(form[-1])
        codes = rng.integers(0, 256, (n, k // 32, 4 * bits), dtype=np.uint8)
        scales = (rng.uniform(0.5, 1.5, n * k // 32) * 1e-2).astype(np.float16)
        return [codes, scales]
    from tests.quant.blocks import random_rows

    return [random_rows(rng, form, n, k)]


def _model(
    form: str, k: int, n: int, copies: int, rng: np.random.Generator, epilogue: str = ""
) -> tuple[bytes, int]:
    from onnx import TensorProto, helper, numpy_helper

    from llmir_core.targets.onnxruntime.native import DOMAIN, GGUF_OP_NAME, NBITS_OP_NAMES

    nodes, inits, outs, nbytes = [], [], [], 0
    for i in range(copies):
        ws = _weights(form, rng, n, k)
        names = [f"w{i}_{j}" for j in range(len(ws))]
        inits += [numpy_helper.from_array(w, nm) for w, nm in zip(ws, names)]
        nbytes = sum(w.nbytes for w in ws)
        if form.startswith("nbits"):
            node = helper.make_node(
                NBITS_OP_NAMES[int(form[-1])], ["x", *names], [f"y{i}"], domain=DOMAIN
            )
        else:
            attrs = {"format": form, **({"epilogue": epilogue} if epilogue else {})}
            node = helper.make_node(GGUF_OP_NAME, ["x", *names], [f"y{i}"], domain=DOMAIN, **attrs)
        nodes.append(node)
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "gg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], outs, inits
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    return model.SerializeToString(), nbytes


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.native import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def bench_shape(
    k: int, n: int, formats: list[str], ms: list[int], threads: int, rounds: int
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(k * 7 + n)
    forms = [
        *NBITS,
        *(f for f in formats if k % (256 if f.endswith("_k") or f == "iq4_xs" else 32) == 0),
    ]
    sess, wbytes, copies = {}, {}, {}
    for f in forms:
        _, probe = _model(f, k, n, 1, rng)
        copies[f] = max(1, min(64, -(-TARGET_BYTES // probe)))
        model, wbytes[f] = _model(f, k, n, copies[f], rng)
        sess[f] = _session(model, threads)
    rows = []
    for m in ms:
        x = rng.standard_normal((m, k)).astype(np.float32)
        for s in sess.values():
            s.run(None, {"x": x})  # warm
        times: dict[str, list[float]] = {f: [] for f in forms}
        clock = time.process_time if threads == 1 else time.perf_counter
        for _ in range(rounds):
            for f, s in sess.items():
                t = clock()
                s.run(None, {"x": x})
                times[f].append((clock() - t) / copies[f])
        med = {f: statistics.median(v) for f, v in times.items()}
        for f in forms:
            rows.append(
                {
                    "K": k,
                    "N": n,
                    "M": m,
                    "form": f,
                    "us": med[f] * 1e6,
                    "min_us": min(times[f]) * 1e6,
                    "weight_bytes": wbytes[f],
                    "gbs": wbytes[f] / med[f] / 1e9,
                    "gflops": 2 * m * n * k / med[f] / 1e9,
                    "vs_nbits_q4": med[f] / med["nbits_q4"],
                    "vs_nbits_q8": med[f] / med["nbits_q8"],
                }
            )
    return rows


# the real Gemma 3 270M Q4_K_M file's MatMulGGUF shapes: (name, K, N, format, epilogue)
DECODE_SHAPES = [
    ("attn_q", 640, 1024, "q5_0", ""),
    ("ffn_gate_up", 640, 4096, "q5_0", "swiglu"),
    ("attn_output", 1024, 640, "q4_k", ""),
    ("ffn_down", 2048, 640, "q6_k", ""),
]
DECODE_MS = (1, 2, 4, 8, 16)


def _variants() -> list[str]:
    from llmir_core.targets.onnxruntime.native import missing_avx512

    return ([] if missing_avx512() else ["avx512"]) + ["avx2"]


def bench_decode(threads: int, rounds: int, ms: list[int]) -> list[dict[str, Any]]:
    """ms per MatMulGGUF call for the real file's shapes at each M, under each kernel variant
    (LLMIR_KERNEL_ISA: the library picks it when a session registers it, so one variant's
    sessions at a time), and the ratio to M = 1."""
    import os

    from llmir_core.targets.onnxruntime.native import ISA_ENV

    rows: list[dict[str, Any]] = []
    saved = os.environ.get(ISA_ENV)
    try:
        for variant in _variants():
            os.environ[ISA_ENV] = variant
            for name, k, n, form, epi in DECODE_SHAPES:
                rng = np.random.default_rng(k * 7 + n)
                probe = _model(form, k, n, 1, rng, epi)[1]
                copies = max(1, min(64, -(-TARGET_BYTES // probe)))
                sess = _session(_model(form, k, n, copies, rng, epi)[0], threads)
                clock = time.process_time if threads == 1 else time.perf_counter
                base = 0.0
                for m in ms:
                    x = rng.standard_normal((m, k)).astype(np.float32)
                    sess.run(None, {"x": x})  # warm
                    times = []
                    for _ in range(rounds):
                        t = clock()
                        sess.run(None, {"x": x})
                        times.append((clock() - t) / copies)
                    ms_call = statistics.median(times) * 1e3
                    base = base or ms_call
                    rows.append(
                        {"shape": name, "K": k, "N": n, "format": form, "epilogue": epi,
                         "variant": variant, "M": m, "ms": ms_call, "vs_m1": ms_call / base}
                    )  # fmt: skip
    finally:
        if saved is None:
            os.environ.pop(ISA_ENV, None)
        else:
            os.environ[ISA_ENV] = saved
    return rows


def _print_decode(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        what = f"{r['shape']} {r['K']}x{r['N']} {r['format']}{' ' + r['epilogue'] if r['epilogue'] else ''}"
        print(
            f"{what:32s} {r['variant']:6s} M={r['M']:3d} {r['ms']:8.3f} ms  x{r['vs_m1']:.2f} of M=1",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", help="KxN (repeatable); default: the built-in set")
    p.add_argument("--m", default="1,128", help="rows of X, comma-separated (default 1,128)")
    p.add_argument("--formats", default=",".join(K_FORMATS + SMALL_FORMATS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--format", choices=("human", "json"), default="human")
    p.add_argument(
        "--decode",
        action="store_true",
        help="the Gemma file's shapes at M = 1, 2, 4, 8, 16 (or --m), each kernel variant",
    )
    a = p.parse_args(argv)
    from llmir_core.targets.onnxruntime.native import unavailable_reason

    why = unavailable_reason()
    if why:
        print(f"error: llmir's custom ops cannot run here: {why}", file=sys.stderr)
        return 2
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shape] if a.shape else SHAPES
    ms = [int(v) for v in a.m.split(",")]
    if a.decode:
        ms = list(DECODE_MS) if a.m == "1,128" else ms
        drows = bench_decode(a.threads, a.rounds, ms)
        if a.format == "json":
            print(json.dumps({"threads": a.threads, "rounds": a.rounds, "rows": drows}, indent=1))
        else:
            _print_decode(drows)
        return 0
    rows: list[dict[str, Any]] = []
    for k, n in shapes:
        rows += bench_shape(k, n, a.formats.split(","), ms, a.threads, a.rounds)
        if a.format == "human":
            for r in rows:
                if (r["K"], r["N"]) == (k, n):
                    rate = f"{r['gbs']:6.1f} GB/s" if r["M"] <= 4 else f"{r['gflops']:6.1f} GFLOP/s"
                    print(
                        f"K={k:5d} N={n:5d} M={r['M']:4d} {r['form']:9s} {r['us']:9.1f} us  {rate}  "
                        f"x{r['vs_nbits_q4']:.2f} of Q4  x{r['vs_nbits_q8']:.2f} of Q8",
                        flush=True,
                    )
    if a.format == "json":
        print(json.dumps({"threads": a.threads, "rounds": a.rounds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
