"""Which 16-bit kernels onnxruntime's CPU provider has here, and how fast they are at decode.

Measures, at the SmolLM2-135M decode shape (batch 1, one token, hidden 576, intermediate 1536,
9 query / 3 KV heads of 64), single-op models and weight chains the size of the real decoder's
projections (so the weights do not fit in cache, as in a real decode step):

- MatMul, Gemm, FusedMatMul with f32 / f16 / bf16 inputs and weights (native 16-bit kernels);
- Cast(f16/bf16 weight -> f32) + MatMul f32 (what a cast-through lowering gives; onnxruntime's
  constant folding may turn it into an f32 initializer at load time);
- MatMulNBits (4 and 8 bits) with f32 / f16 / bf16 activations;
- com.microsoft GroupQueryAttention and ONNX opset-23 Attention with f32 / f16 / bf16 q/k/v.

Each case reports `ok` with the median microseconds per run and its ratio to the f32 case, or the
onnxruntime error that says it has no kernel. CPU features are read from /proc/cpuinfo at run
time. Runs are interleaved (case by case, repeated) so a busy machine affects all alike: read
the ratios, not the absolute numbers.

    python benchmarks/precision_kernels.py [--reps 5] [--threads 2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 576, 1536, 9, 3, 64, 30
PAST = 256

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _onnx_types() -> dict[str, int]:
    from onnx import TensorProto

    return {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def _np_tensor(a: np.ndarray, dt: str, name: str) -> Any:
    """A TensorProto of a (f32 values) stored in dt."""
    from onnx import helper, numpy_helper

    if dt == "f32":
        return numpy_helper.from_array(a.astype(np.float32), name)
    if dt == "f16":
        return numpy_helper.from_array(a.astype(np.float16), name)
    # bf16: the top 16 bits of the f32 pattern, rounded to nearest even
    u = a.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    t = helper.make_tensor(name, _onnx_types()["bf16"], a.shape, r.tobytes(), raw=True)
    return t


def _model(nodes: list[Any], inits: list[Any], ins: list[Any], outs: list[Any]) -> bytes:
    from onnx import helper

    g = helper.make_graph(nodes, "g", ins, outs, initializer=inits)
    m = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)],
    )
    m.ir_version = 10
    return m.SerializeToString()


def chain(kind: str, dt: str, act: str, pairs: int, rng: np.random.Generator) -> bytes:
    """`pairs` x (576->1536, 1536->576) projections of a [1, 576] activation in `act`.
    kind: matmul | gemm | fused | cast (weights stored in dt, Cast to act before MatMul) |
    nbits4 | nbits8 (MatMulNBits, activations in act)."""
    from onnx import helper

    ty = _onnx_types()
    nodes, inits = [], []
    x = "x"
    for i in range(pairs * 2):
        k, n = (HIDDEN, INTER) if i % 2 == 0 else (INTER, HIDDEN)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        y = f"y{i}"
        if kind in ("matmul", "gemm", "fused"):
            inits.append(_np_tensor(w, dt, f"w{i}"))
            if kind == "matmul":
                nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [y]))
            elif kind == "gemm":
                nodes.append(helper.make_node("Gemm", [x, f"w{i}"], [y]))
            else:
                nodes.append(
                    helper.make_node("FusedMatMul", [x, f"w{i}"], [y], domain="com.microsoft")
                )
        elif kind == "cast":
            inits.append(_np_tensor(w, dt, f"w{i}"))
            nodes.append(helper.make_node("Cast", [f"w{i}"], [f"wc{i}"], to=ty[act]))
            nodes.append(helper.make_node("MatMul", [x, f"wc{i}"], [y]))
        else:
            bits = 4 if kind == "nbits4" else 8
            block = 32
            wt = w.T  # [N, K]
            nb = k // block
            blocks = wt.reshape(n, nb, block)
            scale = np.abs(blocks).max(-1) / ((1 << (bits - 1)) - 1) + 1e-8
            q = np.clip(
                np.round(blocks / scale[..., None]), -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            )
            q = (q + (1 << (bits - 1))).astype(np.uint8)
            if bits == 4:
                q = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
            from onnx import numpy_helper

            inits.append(numpy_helper.from_array(q.reshape(n, nb, -1), f"w{i}"))
            inits.append(_np_tensor(scale.reshape(-1), act, f"s{i}"))
            nodes.append(
                helper.make_node(
                    "MatMulNBits",
                    [x, f"w{i}", f"s{i}"],
                    [y],
                    domain="com.microsoft",
                    K=k,
                    N=n,
                    bits=bits,
                    block_size=block,
                    accuracy_level=4 if act == "f32" else 0,
                )
            )
        x = y
    return _model(
        nodes,
        inits,
        [helper.make_tensor_value_info("x", ty[act], [1, HIDDEN])],
        [helper.make_tensor_value_info(x, ty[act], [1, HIDDEN])],
    )


def attention(kind: str, dt: str) -> bytes:
    """One decode step of GroupQueryAttention (com.microsoft, BNSH past of PAST positions) or ONNX
    Attention (opset 23, 4-D past), with q/k/v and the cache in dt."""
    from onnx import TensorProto, helper

    ty = _onnx_types()[dt]
    t = helper.make_tensor_value_info
    if kind == "gqa":
        ins = [
            t("q", ty, [1, 1, HEADS * HEAD_DIM]),
            t("k", ty, [1, 1, KV_HEADS * HEAD_DIM]),
            t("v", ty, [1, 1, KV_HEADS * HEAD_DIM]),
            t("past_k", ty, [1, KV_HEADS, PAST, HEAD_DIM]),
            t("past_v", ty, [1, KV_HEADS, PAST, HEAD_DIM]),
            t("seqlens_k", TensorProto.INT32, [1]),
            t("total_len", TensorProto.INT32, []),
        ]
        node = helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len"],
            ["out", "present_k", "present_v"],
            domain="com.microsoft",
            num_heads=HEADS,
            kv_num_heads=KV_HEADS,
        )
        outs = [
            t("out", ty, [1, 1, HEADS * HEAD_DIM]),
            t("present_k", ty, None),
            t("present_v", ty, None),
        ]
    else:
        ins = [
            t("q", ty, [1, HEADS, 1, HEAD_DIM]),
            t("k", ty, [1, KV_HEADS, 1, HEAD_DIM]),
            t("v", ty, [1, KV_HEADS, 1, HEAD_DIM]),
            t("past_k", ty, [1, KV_HEADS, PAST, HEAD_DIM]),
            t("past_v", ty, [1, KV_HEADS, PAST, HEAD_DIM]),
        ]
        node = helper.make_node(
            "Attention",
            ["q", "k", "v", "", "past_k", "past_v"],
            ["out", "present_k", "present_v"],
            is_causal=0,
        )
        outs = [t("out", ty, None), t("present_k", ty, None), t("present_v", ty, None)]
    return _model([node], [], ins, outs)


def _np_dtype(dt: str) -> Any:
    if dt == "f32":
        return np.float32
    if dt == "f16":
        return np.float16
    import ml_dtypes  # type: ignore[import-not-found]

    return ml_dtypes.bfloat16


def _feeds(sess: Any, rng: np.random.Generator) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if i.type == "tensor(int32)":
            out[i.name] = (
                np.array([PAST], np.int32)
                if i.name == "seqlens_k"
                else np.array(PAST + 1, np.int32)
            )
            continue
        dt = {"tensor(float)": "f32", "tensor(float16)": "f16", "tensor(bfloat16)": "bf16"}[i.type]
        a = rng.standard_normal(shape).astype(np.float32)
        if dt == "bf16":
            try:
                out[i.name] = a.astype(_np_dtype(dt))
            except ImportError:
                import onnxruntime as ort

                # no ml_dtypes: hand onnxruntime the bf16 bytes in an OrtValue
                u = a.view(np.uint32)
                bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
                out[i.name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, 16)
        else:
            out[i.name] = a.astype(_np_dtype(dt))
    return out


def cpu_flags() -> list[str]:
    from llmir_core.runtime.bench import hardware_fingerprint

    return list(hardware_fingerprint().get("cpu_flags", []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median)")
    ap.add_argument("--iters", type=int, default=20, help="runs per repetition")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=15, help="576x1536 + 1536x576 weight pairs")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    a = ap.parse_args(argv)

    import onnxruntime as ort

    rng = np.random.default_rng(0)
    cases: dict[str, Callable[[], bytes]] = {}
    for dt in ("f32", "f16", "bf16"):
        cases[f"MatMul {dt}"] = lambda dt=dt: chain("matmul", dt, dt, a.pairs, rng)
        cases[f"Gemm {dt}"] = lambda dt=dt: chain("gemm", dt, dt, a.pairs, rng)
        cases[f"FusedMatMul {dt}"] = lambda dt=dt: chain("fused", dt, dt, a.pairs, rng)
    for dt in ("f16", "bf16"):
        cases[f"Cast({dt} W)->f32 MatMul"] = lambda dt=dt: chain("cast", dt, "f32", a.pairs, rng)
    for bits in (4, 8):
        for dt in ("f32", "f16", "bf16"):
            cases[f"MatMulNBits{bits} act {dt}"] = lambda b=bits, dt=dt: chain(
                f"nbits{b}", dt, dt, a.pairs, rng
            )
    for kind, label in (("gqa", "GroupQueryAttention"), ("attn", "Attention-23")):
        for dt in ("f32", "f16", "bf16"):
            cases[f"{label} {dt}"] = lambda k=kind, dt=dt: attention(k, dt)

    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.log_severity_level = 3
    sessions: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    for name, make in cases.items():
        try:
            s = ort.InferenceSession(make(), so, providers=["CPUExecutionProvider"])
            feeds = _feeds(s, rng)
            s.run(None, feeds)
            sessions[name] = (s, feeds)
            results[name] = {"ok": True, "us": []}
        except Exception as e:  # noqa: BLE001 - the error is the measurement
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            results[name] = {"ok": False, "error": msg[:240]}
    order = list(sessions)
    for rep in range(a.reps):
        # rotated each repetition: no case always runs first (after the previous one's cache state)
        for name in order[rep % len(order) :] + order[: rep % len(order)]:
            s, feeds = sessions[name]
            t0 = time.perf_counter()
            for _ in range(a.iters):
                s.run(None, feeds)
            results[name]["us"].append((time.perf_counter() - t0) / a.iters * 1e6)
    for r in results.values():
        if r["ok"]:
            r["median_us"] = statistics.median(r["us"])
    base = {
        "matmul": results.get("MatMul f32", {}).get("median_us"),
        "gqa": results.get("GroupQueryAttention f32", {}).get("median_us"),
        "attn": results.get("Attention-23 f32", {}).get("median_us"),
    }
    for name, r in results.items():
        ref = (
            base["gqa"]
            if "Group" in name
            else base["attn"]
            if "Attention-23" in name
            else base["matmul"]
        )
        if r.get("median_us") and ref:
            r["vs_f32"] = ref / r["median_us"]  # > 1: faster than f32
    report = {
        "onnxruntime": ort.__version__,
        "cpu_flags": cpu_flags(),
        "threads": a.threads,
        "weights_mb_f32": round(a.pairs * 2 * HIDDEN * INTER * 4 / 1e6, 1),
        "results": results,
    }
    for name, r in results.items():
        if r["ok"]:
            print(f"{name:32s} {r['median_us']:9.0f} us   speed vs f32 {r.get('vs_f32', 0):5.2f}x")
        else:
            print(f"{name:32s} no kernel: {r['error'][:110]}")
    print("cpu flags:", " ".join(report["cpu_flags"]))
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
        os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
