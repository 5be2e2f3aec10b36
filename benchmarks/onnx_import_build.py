"""Benchmark: `llmir import` + `llmir build --target onnxruntime` of a 1 GB ONNX model with
external data, against a plain copy of the weights file.

    python benchmarks/onnx_import_build.py [--gb 1.0] [--repeat 3] [--json] [--out FILE]

Generates the model in a temp folder (16 MatMul layers of f32 weights, written tensor by tensor so
the generator never holds more than one), then, interleaved and repeated: copies the data file
(`shutil.copyfile`, then fsync, like the build does) and runs import + build in a fresh Python
process, reading its peak RSS from getrusage. The RSS baseline is a process that imports the same
modules and stops. Reports medians; deletes everything afterwards. Targets (issue 3): peak RSS
under 300 MB above the baseline; import + build within 2x of the copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
from llmir_core.frontends import import_model
from llmir_core.targets import build
import llmir_core.frontends.onnx, llmir_core.targets.onnxruntime.graph  # load the libraries (onnx, onnx_ir, onnxruntime)
from llmir_core.dialects.registry import all_ops
all_ops()
t1 = time.perf_counter()
if sys.argv[1] == "baseline":
    print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    sys.exit(0)
src, out_llmir, out_dir = sys.argv[2:5]
module = import_model(src, out_path=out_llmir)
t2 = time.perf_counter()
build(module, out_dir)
t3 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "import_s": t2 - t1, "build_s": t3 - t2,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_model(folder: str, gb: float, hidden: int = 4096) -> tuple[str, str]:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    per = hidden * hidden * 4
    layers = max(1, round(gb * 1e9 / per))
    data_name = "model.onnx.data"
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    with open(os.path.join(folder, data_name), "wb") as fh:
        for i in range(layers):
            fh.write(rng.standard_normal(hidden * hidden, dtype=np.float32).tobytes())
            t = onnx.TensorProto(
                name=f"layers.{i}.weight", data_type=T.FLOAT, dims=[hidden, hidden]
            )
            t.data_location = T.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(i * per)), ("length", str(per))):
                e = t.external_data.add()
                e.key, e.value = k, v
            inits.append(t)
            x = "x" if i == 0 else f"h{i}"
            nodes.append(h.make_node("MatMul", [x, t.name], [f"m{i}"], name=f"layers.{i}.matmul"))
            nodes.append(
                h.make_node(
                    "Relu",
                    [f"m{i}"],
                    [f"h{i + 1}" if i < layers - 1 else "y"],
                    name=f"layers.{i}.relu",
                )
            )
        fh.flush()
        os.fsync(fh.fileno())
    g = h.make_graph(
        nodes,
        "big",
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", hidden])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", hidden])],
        initializer=inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    path = os.path.join(folder, "model.onnx")
    onnx.save(m, path)
    return path, os.path.join(folder, data_name)


def copy_once(src: str, dst: str) -> float:
    t0 = time.perf_counter()
    shutil.copyfile(src, dst)
    with open(dst, "rb+") as fh:
        os.fsync(fh.fileno())
    dt = time.perf_counter() - t0
    os.unlink(dst)
    return dt


def child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--out", help="also write the JSON here (benchmarks/results/onnx_import_build.json)"
    )
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="llmir-bench-")
    try:
        t0 = time.perf_counter()
        src, data = make_model(tmp, args.gb)
        gen_s = time.perf_counter() - t0
        size = os.path.getsize(data)
        baseline = child("baseline")["rss_mb"]
        copies, runs = [], []
        for i in range(args.repeat):  # interleave, so a busy machine hits both alike
            copies.append(copy_once(data, os.path.join(tmp, "copy.data")))
            out_dir = os.path.join(tmp, f"art{i}")
            t0 = time.perf_counter()
            r = child("run", src, os.path.join(tmp, "model.llmir"), out_dir)
            r["process_s"] = time.perf_counter() - t0
            runs.append(r)
            shutil.rmtree(out_dir)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        copy_s = statistics.median(copies)
        work_s = med["import_s"] + med["build_s"]
        result = {
            "weights_bytes": size,
            "generate_s": round(gen_s, 2),
            "repeat": args.repeat,
            "copy_s": round(copy_s, 3),
            "copy_runs_s": [round(c, 3) for c in copies],
            "import_s": round(med["import_s"], 3),
            "build_s": round(med["build_s"], 3),
            "import_build_s": round(work_s, 3),
            "import_build_runs_s": [round(r["import_s"] + r["build_s"], 3) for r in runs],
            "module_load_s": round(med["load_s"], 3),
            "process_s": round(med["process_s"], 3),
            "ratio_vs_copy": round(work_s / copy_s, 2),
            "ratio_vs_copy_whole_process": round(med["process_s"] / copy_s, 2),
            "peak_rss_mb": round(med["rss_mb"], 1),
            "baseline_rss_mb": round(baseline, 1),
            "rss_above_baseline_mb": round(med["rss_mb"] - baseline, 1),
            "loadavg": os.getloadavg()[0],
        }
        result["targets_met"] = {
            "rss_under_300mb_above_baseline": result["rss_above_baseline_mb"] < 300,
            "time_within_2x_of_copy": result["ratio_vs_copy"] <= 2.0,
        }
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(
                    json.dumps({"benchmark": "benchmarks/onnx_import_build.py", **result}, indent=1)
                    + "\n"
                )
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"weights: {size / 1e9:.2f} GB external data (generated in {gen_s:.1f} s)")
            print(
                f"plain copy of the weights: {copy_s:.2f} s (median of {args.repeat}: {result['copy_runs_s']})"
            )
            print(
                f"import {result['import_s']:.2f} s + build {result['build_s']:.2f} s = {work_s:.2f} s "
                f"= {result['ratio_vs_copy']}x the copy (whole process incl. Python start and module "
                f"loading: {result['process_s']:.2f} s = {result['ratio_vs_copy_whole_process']}x)"
            )
            print(
                f"peak RSS {result['peak_rss_mb']:.0f} MB, baseline {baseline:.0f} MB: "
                f"+{result['rss_above_baseline_mb']:.0f} MB"
            )
            print(f"targets: {result['targets_met']}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
