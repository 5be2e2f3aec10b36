"""The official ONNX node tests of the LLM ops through llmir, on the reference interpreter and on
the built onnxruntime artifact (see onnx_node_cases.py for the scope and comparison rules).

The full run (every node-test module, a few minutes) is scripts/gen_onnx_conformance.py; it writes
docs/onnx-conformance.md and onnx_node_baseline.json. Here, in CI:
- the committed numbers are consistent: the doc's summary equals the counts of the baseline's
  cases, each backend keeps MIN_RATE, and the baseline was made with today's LLM op list;
- a sample of the node-test modules (a fixed hash bucket of module names, plus the Cast and
  quantization modules) runs again and must give exactly the recorded results: a regression
  fails, and so does an improvement not yet recorded (rerun the script).
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest

from tests.conformance.baseline import BACKENDS, MIN_RATE, counts, read_baseline
from tests.conformance.onnx_node_cases import LLM_OP_SET, LLM_OPS, CaseResult, run_all

DOC = Path(__file__).resolve().parents[2] / "docs" / "onnx-conformance.md"
ALWAYS = ("cast", "castlike", "dequantizelinear", "quantizelinear")
BUCKETS = 5


def sample_modules() -> list[str]:
    mods = {e["module"] for e in read_baseline()["cases"].values()}
    return sorted(m for m in mods if m in ALWAYS or zlib.crc32(m.encode()) % BUCKETS == 0)


def test_committed_numbers_are_consistent() -> None:
    base = read_baseline()
    assert base["llm_ops"] == {k: list(v) for k, v in LLM_OPS.items()}, (
        "the LLM op list changed: run scripts/gen_onnx_conformance.py"
    )
    assert all(e["op"] in LLM_OP_SET for e in base["cases"].values())
    c = counts(base["cases"])
    doc = DOC.read_text(encoding="utf-8")
    for b in BACKENDS:
        m = re.search(rf"^\| {b} \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+)% \|$", doc, re.M)
        assert m, f"no summary row for {b} in {DOC.name}"
        r = c[b]
        assert [int(x) for x in m.groups()[:4]] == [
            r["in_scope"],
            r["pass"],
            r["fail"],
            r["excluded"],
        ], f"{DOC.name} does not match the baseline: run scripts/gen_onnx_conformance.py"
        assert m.group(5) == f"{100 * r['rate']:.2f}"
        assert r["rate"] >= MIN_RATE, f"{b}: {r['rate']:.2%} < {MIN_RATE:.0%}"
    for ops in LLM_OPS.values():
        assert ", ".join(ops) in doc


@pytest.fixture(scope="module")
def sampled() -> list[CaseResult]:
    return run_all(sample_modules())[0]


def test_sample_covers_the_categories(sampled: list[CaseResult]) -> None:
    in_scope = [r for r in sampled if r.scope is None]
    assert len(in_scope) >= 250
    assert len({r.op for r in in_scope}) >= 20


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_matches_the_baseline(sampled: list[CaseResult], backend: str) -> None:
    recorded = read_baseline()["cases"]
    mods = set(sample_modules())
    now = {r.name: r for r in sampled if r.scope is None}
    want = {n for n, e in recorded.items() if e["module"] in mods}
    assert set(now) == want, (
        f"cases not recorded: {sorted(set(now) - want)[:5]}, recorded but gone: "
        f"{sorted(want - set(now))[:5]}; run scripts/gen_onnx_conformance.py"
    )
    wrong = [
        f"{n}: recorded {recorded[n][backend]}, now {r.status.get(backend)} "
        f"({r.reason.get(backend, '')})"
        for n, r in sorted(now.items())
        if r.status.get(backend) != recorded[n][backend] or r.op != recorded[n]["op"]
    ]
    assert not wrong, "\n".join(wrong)
