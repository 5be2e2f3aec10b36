"""The int8 matmul forms onnxruntime's CPU provider offers, on a stack of projections shaped like
a decoder (default SmolLM2-135M: 30 layers of qkv 576->960, o 576->576, gate/up 576->1536,
down 1536->576, then the 576->49152 head), random weights, each form its own model:

    f32         MatMul
    nb8b32a4    MatMulNBits 8-bit, block 32, accuracy_level 4 (int8 activations)
    nb8b64a4    the same with block 64
    nb8b32a4z   block 32 with zero points
    nb8b32a1    accuracy_level 1 (f32 activations)
    dq-u8       DynamicQuantizeMatMul, uint8 weights + zero point 128 (MLAS u8u8)
    dq-s8pair   DynamicQuantizeMatMul, int8 weights with adjacent pairs bounded (MLAS u8s8)
    dq-s8       DynamicQuantizeMatMul, plain int8 weights (u8s8; saturates on AVX2: see --check)

Times one decode step (M = 1) and a 128-token prefill (M = 128) per form, interleaved round by
round, as CPU time of one thread by default (a busy machine inflates wall time of every form
differently; --wall --threads 2 for wall time). --check compares each DynamicQuantizeMatMul
form's output with the exact integer result of its own quantization (the u8s8 saturation).

    python benchmarks/int8_kernels.py --rounds 3
    python benchmarks/int8_kernels.py --forms nb8b32a4,dq-s8pair --layers 4 --check
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HIDDEN, INTER, QKV, VOCAB = 576, 1536, 960, 49152
FORMS = ("nb8b32a4", "f32", "nb8b64a4", "nb8b32a4z", "nb8b32a1", "dq-u8", "dq-s8pair", "dq-s8")


def _nbits(w: np.ndarray, block: int, zero: bool) -> tuple[np.ndarray, np.ndarray, Any]:
    from llmir_core.quant import nbits

    codes, scales, zp = nbits.quantize(w, 8, block, not zero, np.dtype(np.float32))
    n, k = w.shape
    return codes.reshape(n, k // block, block), scales.reshape(-1), zp


def _dq(w: np.ndarray, form: str) -> tuple[np.ndarray, np.ndarray, Any]:
    from llmir_core.quant import qgemm

    q, s = qgemm.quantize_rows(w, pairs=form == "dq-s8pair")
    if form == "dq-u8":
        b = (q.T.astype(np.int16) + 128).astype(np.uint8)
        return np.ascontiguousarray(b), s, np.full(s.size, 128, np.uint8)
    return np.ascontiguousarray(q.T), s, None


def project(
    form: str, x: str, name: str, w: np.ndarray, out: str, inits: list, nodes: list
) -> None:  # type: ignore[type-arg]
    from onnx import helper, numpy_helper

    n, k = w.shape
    if form == "f32":
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), name))
        nodes.append(helper.make_node("MatMul", [x, name], [out]))
        return
    ins = [x, name, name + ".s"]
    if form.startswith("nb8"):
        block = 64 if "b64" in form else 32
        b, s, zp = _nbits(w, block, form.endswith("z"))
        attrs = {"K": k, "N": n, "bits": 8, "block_size": block}
        attrs["accuracy_level"] = 1 if form.endswith("a1") else 4
        op = "MatMulNBits"
    else:
        b, s, zp = _dq(w, form)
        attrs, op = {}, "DynamicQuantizeMatMul"
    inits += [numpy_helper.from_array(b, name), numpy_helper.from_array(s, name + ".s")]
    if zp is not None:
        inits.append(numpy_helper.from_array(np.asarray(zp).reshape(-1), name + ".z"))
        ins.append(name + ".z")
    nodes.append(helper.make_node(op, ins, [out], domain="com.microsoft", **attrs))


def build(form: str, layers: int, path: Path, seed: int = 0) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(n: int, k: int) -> np.ndarray:
        return (rng.standard_normal((n, k), np.float32) * 0.05).astype(np.float32)

    inits: list = []  # type: ignore[type-arg]
    nodes: list = []  # type: ignore[type-arg]
    x = "x"
    for i in range(layers):
        p = f"l{i}."
        project(form, x, p + "wqkv", w(QKV, HIDDEN), p + "qkv", inits, nodes)
        nodes.append(helper.make_node("Slice", [p + "qkv", "zero", "hidden", "last"], [p + "q"]))
        project(form, p + "q", p + "wo", w(HIDDEN, HIDDEN), p + "o", inits, nodes)
        nodes.append(helper.make_node("Add", [x, p + "o"], [p + "r"]))
        project(form, p + "r", p + "wg", w(INTER, HIDDEN), p + "g", inits, nodes)
        project(form, p + "r", p + "wu", w(INTER, HIDDEN), p + "u", inits, nodes)
        nodes.append(helper.make_node("Mul", [p + "g", p + "u"], [p + "gu"]))
        project(form, p + "gu", p + "wd", w(HIDDEN, INTER), p + "d", inits, nodes)
        nodes.append(helper.make_node("Add", [p + "r", p + "d"], [p + "x"]))
        x = p + "x"
    project(form, x, "head", w(VOCAB, HIDDEN), "y", inits, nodes)
    for name, v in (("zero", 0), ("hidden", HIDDEN), ("last", -1)):
        inits.append(numpy_helper.from_array(np.array([v], np.int64), name))
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "m", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "m", VOCAB])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")


def check(form: str) -> float:
    """Relative max difference between onnxruntime and the exact integer result of the form's
    own quantization, on one 576 -> 1536 projection of Gaussian data (M = 4)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from llmir_core.quant import qgemm

    rng = np.random.default_rng(1)
    w = rng.standard_normal((INTER, HIDDEN)).astype(np.float32) * 0.02
    x = rng.standard_normal((4, HIDDEN)).astype(np.float32)
    inits: list = []  # type: ignore[type-arg]
    nodes: list = []  # type: ignore[type-arg]
    project(form, "x", "w", w, "y", inits, nodes)
    graph = helper.make_graph(
        nodes,
        "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, INTER])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": x})[0]
    q, s = qgemm.quantize_rows(w, pairs=form == "dq-s8pair")
    ref = qgemm.matmul(x, q, s)
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forms", default=",".join(FORMS), help="comma-separated; the first is 1.00x")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall time instead of CPU time")
    ap.add_argument("--check", action="store_true", help="also check DynamicQuantizeMatMul sums")
    args = ap.parse_args()
    import onnxruntime as ort

    forms = args.forms.split(",")
    bad = sorted(set(forms) - set(FORMS))
    if bad:
        raise SystemExit(f"unknown form(s): {', '.join(bad)} (known: {', '.join(FORMS)})")
    clock = time.perf_counter if args.wall else time.process_time
    with tempfile.TemporaryDirectory(prefix="int8-kernels-") as tmp:
        sessions = {}
        for f in forms:
            path = Path(tmp) / f"{f}.onnx"
            build(f, args.layers, path)
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.log_severity_level = 3
            sessions[f] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        xs = {m: rng.standard_normal((1, m, HIDDEN)).astype(np.float32) for m in (1, 128)}
        times: dict[str, dict[int, list[float]]] = {f: {1: [], 128: []} for f in forms}
        for f in forms:
            for m in xs:
                sessions[f].run(None, {"x": xs[m]})
        for _ in range(args.rounds):
            for f in forms:
                for m, reps in ((1, 10), (128, 2)):
                    t = clock()
                    for _ in range(reps):
                        sessions[f].run(None, {"x": xs[m]})
                    times[f][m].append((clock() - t) / reps * 1e3)
    base = {m: float(np.median(times[forms[0]][m])) for m in (1, 128)}
    kind = "wall" if args.wall else "CPU"
    print(
        f"{args.layers} layers + head, {args.threads} thread(s), {kind} time, medians of {args.rounds}"
    )
    for f in forms:
        d, p = (float(np.median(times[f][m])) for m in (1, 128))
        line = f"{f:10s} decode {d:8.2f} ms ({base[1] / d:4.2f}x)  prefill-128 {p:8.1f} ms ({base[128] / p:4.2f}x)"
        if args.check and f.startswith("dq-"):
            line += f"  vs exact integer sum: rel {check(f):.1e}"
        print(line)


if __name__ == "__main__":
    main()
