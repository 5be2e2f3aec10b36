"""The committed result of the full ONNX node-test run (onnx_node_baseline.json): what
scripts/gen_onnx_conformance.py writes and tests/conformance/test_onnx_node.py checks.

Each in-scope case is recorded as [module, op, reference status, onnxruntime status]; the numbers
in docs/onnx-conformance.md are computed from these entries (`counts`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

BASELINE = Path(__file__).with_name("onnx_node_baseline.json")
BACKENDS = ("reference", "onnxruntime")
MIN_RATE = 0.97  # the pass rate each backend must keep over the LLM ops' node tests


@functools.lru_cache(maxsize=1)
def read_baseline() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(BASELINE.read_text(encoding="utf-8"))
    data["cases"] = {
        name: {"module": m, "op": op, "reference": r, "onnxruntime": o}
        for name, (m, op, r, o) in data["cases"].items()
    }
    return data


def render_baseline(header: dict[str, Any], cases: dict[str, list[str]]) -> str:
    """JSON with one line per case (small diffs when a case changes)."""
    head = json.dumps(header, indent=1, sort_keys=True)
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(cases.items()))
    return head[:-2] + ',\n "cases": {\n' + rows + "\n }\n}\n"


def counts(cases: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Per backend: in scope, passed, failed, excluded and the pass rate passed / (in scope -
    excluded)."""
    out: dict[str, dict[str, Any]] = {}
    for b in BACKENDS:
        st = [e[b] for e in cases.values()]
        n_pass, n_fail, n_exc = st.count("pass"), st.count("fail"), st.count("excluded")
        runnable = len(st) - n_exc
        out[b] = {
            "in_scope": len(st),
            "pass": n_pass,
            "fail": n_fail,
            "excluded": n_exc,
            "rate": n_pass / runnable if runnable else 1.0,
        }
    return out
