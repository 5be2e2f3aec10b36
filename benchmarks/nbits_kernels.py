"""llmir's block-quantized matmul (ai.llmir MatMulNBitsQ4/Q8, llmir_core/targets/onnxruntime/native/
matmul_nbits.c) against the onnxruntime op it replaces (com.microsoft MatMulNBits, block 32,
accuracy_level 4: int8 activations), one op shape at a time, on the same random weights.

Each form's model holds COPIES nodes of one shape, each with its own weights (together larger
than the last-level cache, so every decode step reads its weights from memory), all fed the same
X. The forms run interleaved round by round in one process; the time per node is the minimum
over rounds (the least disturbed one) of one run / copies: CPU time of the process with
--threads 1 (the default: a busy machine inflates wall time unevenly), wall time otherwise.
Decode rows (M <= 4) report GB/s = weight bytes (codes + f32 scales) / time, prefill rows
GFLOP/s = 2 M N K / time. `err` is max |Y - X @ W^T| / max |X @ W^T| against the f32 weights the
blocks were made from (the quantization error plus the op's own: int8 activations in both).

    python benchmarks/nbits_kernels.py                       # SmolLM2 + Qwen2.5 shapes, int4
    python benchmarks/nbits_kernels.py --bits 8 --m 1 --threads 2 --format json

--batched times llmir's kernel alone at several rows of X (decode of several sequences) under
each instruction-set variant (LLMIR_KERNEL_ISA: the AVX-512 VNNI one where the CPU has it, and
the AVX2 fallback), on the Gemma 3 tied LM head (N=262144, K=640, int8 blocks) and a 640 x 2048
projection: ms per call (the clock as above) and the ratio to one row.

    python benchmarks/nbits_kernels.py --batched --m 1,2,4,8,16

--swiglu instead times a gated MLP's first half on llmir's kernel, the two forms a build can
emit: `unfused` (gate and up as two ops, then com.microsoft QuickGelu alpha 1 and Mul) and
`fused` (one op over [gate; up] with `epilogue = "swiglu"`); --f16-scales stores f16 block scales
(what `scale_dtype = "f16"` builds run) in both.

    python benchmarks/nbits_kernels.py --swiglu --m 1,128 --f16-scales
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

SHAPES = {  # (K, N) of the decoder projections and heads
    "smollm2": [(576, 576), (576, 960), (576, 1536), (1536, 576), (576, 49152)],
    "qwen2.5": [(896, 896), (896, 1152), (896, 4864), (4864, 896), (896, 151936)],
}
FORMS = ("mlas", "llmir")
TARGET_BYTES = 40 << 20  # weights per model: past the last-level cache


def _model(form: str, bits: int, k: int, n: int, weights: list[tuple[Any, ...]]) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    from llmir_core.targets.onnxruntime.native import DOMAIN

    nodes, inits, outs = [], [], []
    for i, (codes, scales, *zp) in enumerate(weights):
        inits += [numpy_helper.from_array(codes, f"b{i}"), numpy_helper.from_array(scales, f"s{i}")]
        ins = ["x", f"b{i}", f"s{i}"]
        if zp:
            inits.append(numpy_helper.from_array(zp[0], f"z{i}"))
            ins.append(f"z{i}")
        if form == "mlas":
            node = helper.make_node(
                "MatMulNBits",
                ins,
                [f"y{i}"],
                domain="com.microsoft",
                K=k,
                N=n,
                bits=bits,
                block_size=32,
                accuracy_level=4,
            )
        else:
            node = helper.make_node(f"MatMulNBitsQ{bits}", ins, [f"y{i}"], domain=DOMAIN)
        nodes.append(node)
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "nb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], outs, inits
    )
    opsets = [helper.make_opsetid(d, 1) for d in ("com.microsoft", DOMAIN)]
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), *opsets]
    ).SerializeToString()  # type: ignore[no-any-return]


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.native import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def bench_shape(
    k: int,
    n: int,
    bits: int,
    ms: list[int],
    threads: int,
    rounds: int,
    wall: bool,
    zero: bool = False,
) -> list[dict]:  # type: ignore[type-arg]
    from llmir_core.quant import nbits

    rng = np.random.default_rng(k * 7 + n)
    nb = k // 32
    wbytes = n * k * bits // 8 + n * nb * 4
    copies = max(1, min(64, -(-TARGET_BYTES // wbytes)))
    w0 = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    codes, sc, zp = nbits.quantize(w0, bits, 32, not zero, np.dtype(np.float32))
    first: tuple[Any, ...] = (codes.reshape(n, nb, -1), sc.reshape(-1).astype(np.float32))
    if zero:
        first = (*first, zp.reshape(-1))
    weights = [first] + [
        (rng.integers(0, 256, (n, nb, 32 * bits // 8), dtype=np.uint8), *first[1:])
        for _ in range(copies - 1)
    ]
    sess = {f: _session(_model(f, bits, k, n, weights), threads) for f in FORMS}
    # one thread: CPU time of this process (a busy machine inflates wall time unevenly)
    clock = time.process_time if threads == 1 and not wall else time.perf_counter
    rows = []
    for m in ms:
        x = rng.standard_normal((m, k)).astype(np.float32)
        ref = x.astype(np.float64) @ w0.astype(np.float64).T
        err = {}
        for f, s in sess.items():
            y = s.run(["y0"], {"x": x})[0]
            err[f] = float(np.abs(y - ref).max() / np.abs(ref).max())
            s.run(None, {"x": x})  # warm
        times: dict[str, list[float]] = {f: [] for f in FORMS}
        for _ in range(rounds):
            for f, s in sess.items():
                t = clock()
                s.run(None, {"x": x})
                times[f].append((clock() - t) / copies)
        med = {f: min(v) for f, v in times.items()}  # the least disturbed round
        row = {"K": k, "N": n, "M": m, "bits": bits, "copies": copies}
        for f in FORMS:
            row[f"{f}_us"] = med[f] * 1e6
            row[f"{f}_gbs"] = wbytes / med[f] / 1e9
            row[f"{f}_gflops"] = 2 * m * n * k / med[f] / 1e9
            row[f"{f}_err"] = err[f]
        row["speedup"] = med["mlas"] / med["llmir"]
        rows.append(row)
    return rows


GATED = {"smollm2": (576, 1536), "qwen2.5": (896, 4864)}  # (hidden, intermediate)


def _swiglu_model(form: str, bits: int, weights: list[tuple[Any, ...]]) -> bytes:
    """COPIES gated MLP first halves on llmir's kernel: each weight tuple is [gate; up] blocks."""
    from onnx import TensorProto, helper, numpy_helper

    from llmir_core.targets.onnxruntime.native import DOMAIN

    op = f"MatMulNBitsQ{bits}"
    nodes, inits, outs = [], [], []
    for i, (codes, scales) in enumerate(weights):
        n2, nb = codes.shape[0] // 2, codes.shape[1]
        if form == "fused":
            inits += [
                numpy_helper.from_array(codes, f"b{i}"),
                numpy_helper.from_array(scales, f"s{i}"),
            ]
            nodes.append(
                helper.make_node(
                    op, ["x", f"b{i}", f"s{i}"], [f"y{i}"], domain=DOMAIN, epilogue="swiglu"
                )
            )
        else:
            sc = scales.reshape(2, n2 * nb)
            for h, tag in enumerate(("g", "u")):
                inits += [
                    numpy_helper.from_array(
                        np.ascontiguousarray(codes[h * n2 : (h + 1) * n2]), f"b{tag}{i}"
                    ),
                    numpy_helper.from_array(np.ascontiguousarray(sc[h]), f"s{tag}{i}"),
                ]
                nodes.append(
                    helper.make_node(
                        op, ["x", f"b{tag}{i}", f"s{tag}{i}"], [f"{tag}{i}"], domain=DOMAIN
                    )
                )
            nodes.append(
                helper.make_node(
                    "QuickGelu", [f"g{i}"], [f"a{i}"], domain="com.microsoft", alpha=1.0
                )
            )
            nodes.append(helper.make_node("Mul", [f"a{i}", f"u{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "sw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], outs, inits
    )
    opsets = [helper.make_opsetid(d, 1) for d in ("com.microsoft", DOMAIN)]
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), *opsets]
    ).SerializeToString()  # type: ignore[no-any-return]


def bench_swiglu(
    k: int, inter: int, bits: int, ms: list[int], threads: int, rounds: int, wall: bool, f16: bool
) -> list[dict]:  # type: ignore[type-arg]
    from llmir_core.quant import nbits

    rng = np.random.default_rng(k + inter)
    n, nb = 2 * inter, k // 32
    wbytes = n * k * bits // 8 + n * nb * (2 if f16 else 4)
    copies = max(1, min(64, -(-TARGET_BYTES // wbytes)))
    w0 = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    sd = np.dtype(np.float16 if f16 else np.float32)
    codes, sc, _ = nbits.quantize(w0, bits, 32, True, sd)
    first = (codes.reshape(n, nb, -1), sc.reshape(-1))
    weights = [first] + [
        (rng.integers(0, 256, (n, nb, 32 * bits // 8), dtype=np.uint8), first[1])
        for _ in range(copies - 1)
    ]
    forms = ("unfused", "fused")
    sess = {f: _session(_swiglu_model(f, bits, weights), threads) for f in forms}
    clock = time.process_time if threads == 1 and not wall else time.perf_counter
    rows = []
    for m in ms:
        x = rng.standard_normal((m, k)).astype(np.float32)
        ya, yb = (s.run(["y0"], {"x": x})[0] for s in sess.values())
        err = float(np.abs(ya - yb).max() / max(float(np.abs(ya).max()), 1e-30))
        times: dict[str, list[float]] = {f: [] for f in forms}
        for _ in range(rounds):
            for f, s in sess.items():
                t = clock()
                s.run(None, {"x": x})
                times[f].append((clock() - t) / copies)
        med = {f: min(v) for f, v in times.items()}
        row = {"K": k, "I": inter, "M": m, "bits": bits, "f16_scales": f16, "copies": copies}
        for f in forms:
            row[f"{f}_us"] = med[f] * 1e6
            row[f"{f}_gbs"] = wbytes / med[f] / 1e9
        row["fused_vs_unfused_diff"] = err
        row["speedup"] = med["unfused"] / med["fused"]
        rows.append(row)
    return rows


BATCHED = [(640, 262144, 8), (640, 2048, 8), (640, 2048, 4)]  # (K, N, bits)


def _variants() -> list[str]:
    """The LLMIR_KERNEL_ISA values this CPU runs: avx512 (where it has AVX-512 VNNI) and avx2."""
    from llmir_core.targets.onnxruntime.native import missing_avx512

    return ([] if missing_avx512() else ["avx512"]) + ["avx2"]


def bench_batched(ms: list[int], threads: int, rounds: int, wall: bool) -> list[dict]:  # type: ignore[type-arg]
    """ms per call of llmir's kernel at each M, per variant (the variant is chosen when a session
    registers the library: each variant's sessions are made and timed under its own setting)."""
    import os

    from llmir_core.quant import nbits

    clock = time.process_time if threads == 1 and not wall else time.perf_counter
    rows = []
    for k, n, bits in BATCHED:
        rng = np.random.default_rng(k + n + bits)
        nb = k // 32
        wbytes = n * k * bits // 8 + n * nb * 2
        copies = max(1, min(64, -(-TARGET_BYTES // wbytes)))
        w0 = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        codes, sc, _ = nbits.quantize(w0, bits, 32, True, np.dtype(np.float16))
        first = (codes.reshape(n, nb, -1), sc.reshape(-1))  # f16 scales, as GGUF files hold
        weights = [first] + [
            (rng.integers(0, 256, (n, nb, 32 * bits // 8), dtype=np.uint8), first[1])
            for _ in range(copies - 1)
        ]
        model = _model("llmir", bits, k, n, weights)
        for isa in _variants():
            os.environ["LLMIR_KERNEL_ISA"] = isa
            sess = _session(model, threads)
            base = 0.0
            for m in ms:
                x = rng.standard_normal((m, k)).astype(np.float32)
                sess.run(None, {"x": x})  # warm
                best = float("inf")
                for _ in range(rounds):
                    t = clock()
                    sess.run(None, {"x": x})
                    best = min(best, (clock() - t) / copies)
                base = base or best
                row = {"K": k, "N": n, "bits": bits, "M": m, "isa": isa, "copies": copies}
                rows.append({**row, "ms": best * 1e3, "vs_m1": best / base})
                row_gbs = wbytes / best / 1e9
                print(
                    f"K={k} N={n:6} int{bits} {isa:6} M={m:2}: {best * 1e3:8.3f} ms "
                    f"({row_gbs:5.1f} GB/s) x{best / base:.2f} of M=1",
                    flush=True,
                )
            del sess
        os.environ.pop("LLMIR_KERNEL_ISA", None)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="smollm2,qwen2.5")
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--m", default="1,128", help="rows of X (1: decode, 128: prefill)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall time (always with --threads > 1)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--zero", action="store_true", help="blocks with zero points (asymmetric)")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    ap.add_argument("--swiglu", action="store_true", help="fused vs unfused gated MLP first half")
    ap.add_argument("--f16-scales", action="store_true", help="f16 block scales (--swiglu)")
    ap.add_argument("--batched", action="store_true", help="llmir's kernel at several M, per ISA")
    a = ap.parse_args()
    ms = [int(v) for v in a.m.split(",")]
    rows = []
    if a.batched:
        rows = bench_batched(ms, a.threads, a.rounds, a.wall)
        if a.format == "json":
            print(json.dumps({"threads": a.threads, "rows": rows}, indent=1))
        return
    if a.swiglu:
        for model in a.models.split(","):
            k, inter = GATED[model]
            for r in bench_swiglu(k, inter, a.bits, ms, a.threads, a.rounds, a.wall, a.f16_scales):
                r["model"] = model
                rows.append(r)
                if a.format == "text":
                    print(
                        f"{model:8} K={k:5} I={inter:5} M={r['M']:3} int{a.bits}"
                        f"{' f16-scales' if a.f16_scales else ''}: unfused {r['unfused_us']:9.1f} us"
                        f" | fused {r['fused_us']:9.1f} us | x{r['speedup']:.2f} "
                        f"(diff {r['fused_vs_unfused_diff']:.1e})",
                        flush=True,
                    )
        if a.format == "json":
            print(json.dumps({"threads": a.threads, "rows": rows}, indent=1))
        return
    for model in a.models.split(","):
        for k, n in SHAPES[model]:
            for r in bench_shape(k, n, a.bits, ms, a.threads, a.rounds, a.wall, a.zero):
                r["model"] = model
                rows.append(r)
                if a.format == "text":
                    # decode rows: weight bytes per second; prefill rows: GFLOP/s
                    unit, key = ("GB/s", "gbs") if r["M"] <= 4 else ("GFLOP/s", "gflops")
                    print(
                        f"{model:8} K={k:5} N={n:6} M={r['M']:3} int{a.bits}: "
                        f"mlas {r['mlas_us']:9.1f} us {r['mlas_' + key]:5.1f} {unit} "
                        f"err {r['mlas_err']:.1e} | llmir {r['llmir_us']:9.1f} us "
                        f"{r['llmir_' + key]:5.1f} {unit} err {r['llmir_err']:.1e} | "
                        f"x{r['speedup']:.2f}",
                        flush=True,
                    )
    if a.format == "json":
        import os

        doc = {"threads": a.threads, "clock": "cpu" if a.threads == 1 and not a.wall else "wall"}
        doc["loadavg"] = os.getloadavg()[0]
        print(json.dumps({**doc, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
