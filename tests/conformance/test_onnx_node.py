"""The official ONNX backend node tests through llmir, on the reference interpreter and on the
built onnxruntime artifact (see onnx_node_cases.py for scope and comparison rules).

Fails if either backend's pass rate over the in-scope node tests drops below 98%, or if a test
recorded as passing in onnx_node_baseline.json (written by scripts/gen_onnx_conformance.py, with
docs/onnx-conformance.md) now fails. Runs every case once per session (about a minute on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance.onnx_node_cases import BACKENDS, CaseResult, run_all, summarize

BASELINE = Path(__file__).with_name("onnx_node_baseline.json")
MIN_RATE = 0.98

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> list[CaseResult]:
    return run_all()[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pass_rate(results: list[CaseResult], backend: str) -> None:
    s = summarize(results)[backend]
    failing = [
        f"{r.name}: {r.reason.get(backend)}"
        for r in results
        if r.scope is None and r.status.get(backend) == "fail"
    ]
    assert s["rate"] >= MIN_RATE, (
        f"{backend}: {s['pass']}/{s['runnable']} = {s['rate']:.2%} < {MIN_RATE:.0%}; "
        "failing:\n" + "\n".join(failing)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_regression(results: list[CaseResult], backend: str) -> None:
    if not BASELINE.is_file():
        pytest.skip("no baseline recorded (run scripts/gen_onnx_conformance.py)")
    recorded = set(json.loads(BASELINE.read_text())["passing"][backend])
    now = {r.name: r for r in results}
    regressed = sorted(n for n in recorded if n in now and now[n].status.get(backend) != "pass")
    assert not regressed, "\n".join(f"{n}: {now[n].reason.get(backend)}" for n in regressed)


def test_scope_is_the_llm_op_set(results: list[CaseResult]) -> None:
    s = summarize(results)
    assert s["in_scope"] >= 1000, s  # the node tests of ops the ONNX frontend maps
