"""Benchmark `llmir optimize -O2 --verify-each` on a 30-layer decoder of SmolLM2-135M's shape.

Builds the decoder in the decomposed style exporters produce (tests/passes/decoder.py), writes it
to a .llmir file, runs `-O2` with translation validation after every pass, prints the time of each
pass and of each validation, then checks the optimized model's outputs against the original's
with the float64 reference interpreter (seq=1 and seq=3).

    python benchmarks/optimize_bench.py [--layers 30] [--json] [--no-outputs]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from llmir_core.ir.parser import parse_file  # noqa: E402
from llmir_core.ir.printer import print_module  # noqa: E402
from llmir_core.passes.base import clone_module  # noqa: E402
from llmir_core.passes.manager import run_pipeline  # noqa: E402
from llmir_core.passes.pipeline import preset  # noqa: E402
from llmir_core.passes.report import format_report, format_times  # noqa: E402
from llmir_core.smt.differential import compare  # noqa: E402
from llmir_core.smt.tv import validate_pass  # noqa: E402
from tests.passes.decoder import SMOLLM2_135M, build_decoder  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M.layers)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-outputs", action="store_true", help="skip the end-to-end output check")
    ap.add_argument("--report", action="store_true", help="also print the optimization report")
    args = ap.parse_args()
    shape = SMOLLM2_135M.__class__(**{**SMOLLM2_135M.__dict__, "layers": args.layers})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "decoder.llmir")
        with open(path, "w") as fh:
            fh.write(print_module(build_decoder(shape)))
        t0 = time.perf_counter()
        module = parse_file(path)
        t_parse = time.perf_counter() - t0
    original = clone_module(module)
    t0 = time.perf_counter()
    res = run_pipeline(module, preset(2), validator=validate_pass)
    t_total = time.perf_counter() - t0
    ok = res.failed_validation is None and all(
        r.validation and r.validation["verdict"] == "equivalent" for r in res.runs
    )
    out_check: dict[str, object] = {}
    if not args.no_outputs:
        t1 = time.perf_counter()
        out_check = compare(original, res.module, seeds=1)
        out_check["seconds"] = round(time.perf_counter() - t1, 3)
    summary = {
        "layers": shape.layers,
        "shape": shape.__dict__,
        "parse_s": round(t_parse, 3),
        "pipeline_s": round(t_total, 3),
        "passes_s": round(sum(r.seconds for r in res.runs), 3),
        "validation_s": round(res.validation_seconds, 3),
        "all_validated": ok,
        "ops_before": res.before.ops,
        "ops_after": res.after.ops,
        "passes": [
            {
                "pass": r.name,
                "ms": round(1000 * r.seconds, 2),
                "validation_ms": round(1000 * float((r.validation or {}).get("seconds", 0.0)), 2),
                "verdict": (r.validation or {}).get("verdict"),
                "method": (r.validation or {}).get("method"),
            }
            for r in res.runs
        ],
        "outputs": out_check,
    }
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(format_times(res), end="")
        if args.report:
            print(format_report(res), end="")
        print(
            f"decoder: {shape.layers} layers, hidden {shape.hidden}, {res.before.ops} -> {res.after.ops} ops"
        )
        print(
            f"parse {t_parse:.2f} s; passes {summary['passes_s']} s; translation validation "
            f"{res.validation_seconds:.2f} s (target < 10 s); every pass validated: {ok}"
        )
        if out_check:
            print(
                f"outputs vs original: {out_check.get('verdict')} by {out_check.get('method')} "
                f"({out_check.get('seconds')} s)"
            )
    good = ok and (not out_check or out_check.get("verdict") == "equivalent")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
