"""llmir's kernels under hostile inputs (issue 24): every case in its own python
(tests/decoder/kernel_cases.py), so a crash is a failed test, not a dead worker.

- The MatMulNBits reproductions: B shrinking from 65536 rows to 1 between calls (SIGSEGV when
  the kernel kept N from its first call), small shrinking sizes (heap garbage in the missing
  rows), B sliced by the prompt length inside the graph (what `llmir run` fed it).
- A bounded subset of scripts/fuzz_kernels.py: the first CASES_PER_OP cases of every op and a
  spread of hostile ones, against the -O3 library, and a smaller set against the ASan + UBSan
  build (skipped where gcc has no libasan). The full set: `python scripts/fuzz_kernels.py
  [--asan]`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from llmir_core.targets.onnxruntime.native import library_path, unavailable_reason
from tests.decoder.kernel_cases import Case, all_cases, asan_env, run_isolated

WHY = unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"llmir's custom ops cannot run: {WHY}")

REPROS = ["repro-65536-rows-then-1", "repro-small-rows-shrink", "repro-b-sliced-by-prompt"]
# one hostile case of each kind per op family (names shared by the families that have them)
SUBSET = [
    "valid-decode",
    "weight-shrinks-between-calls",
    "rows-overflow-int64",
    "nan-in-x",
    "scales-short",
    "k-mismatch-larger",
    "epilogue-swiglu-odd-n",
    "panel-n-int64-max",
    "total-int32-max",
    "seqlens-past-beyond-cache",
    "past-grows-and-shrinks",
    "present-bound-onto-past",
    "attr-heads-int64-max",
    "int8-past-grows",
    "h-changes-between-calls",
    "skip-shape-differs",
]
ASAN_SUBSET = [*REPROS, "weight-shrinks-between-calls", "past-grows-and-shrinks"]


def _cases(names: list[str]) -> list[Case]:
    return [c for c in all_cases() if c.name in names]


def _id(c: Case) -> str:
    return f"{c.op}/{c.name}"


@pytest.fixture(scope="module")
def lib_env() -> dict[str, str]:
    return {"LLMIR_FUZZ_LIB": library_path()}


@pytest.fixture(scope="module")
def asan_lib_env() -> Iterator[dict[str, str]]:
    if not shutil.which("gcc"):
        pytest.skip("no gcc: the ASan build needs gcc's libasan")
    probe = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True)
    if not os.path.isabs(probe.stdout.strip()):
        pytest.skip("gcc has no libasan")
    yield asan_env(library_path(sanitized=True))


def _explain(r: object) -> str:
    return f"{r.case.op}/{r.case.name}: {r.status}: {r.detail}"  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", [c for c in all_cases() if c.name in REPROS], ids=_id)
def test_nbits_reproductions(case: Case, lib_env: dict[str, str]) -> None:
    r = run_isolated(case, lib_env)
    assert r.passed, _explain(r)
    # the shrunk B is computed from the B of that call, the mismatched scales refused
    calls = r.detail.split("; ")
    assert all(c.startswith(("ref->ok", "error->error")) for c in calls), r.detail


@pytest.mark.parametrize("case", _cases(SUBSET), ids=_id)
def test_kernel_fuzz_subset(case: Case, lib_env: dict[str, str]) -> None:
    r = run_isolated(case, lib_env)
    assert r.passed, _explain(r)


@pytest.mark.parametrize("case", _cases(ASAN_SUBSET), ids=_id)
def test_kernel_fuzz_asan(case: Case, asan_lib_env: dict[str, str]) -> None:
    r = run_isolated(case, asan_lib_env)
    assert r.passed, _explain(r)


def test_every_registered_op_has_25_hostile_cases() -> None:
    """Every op the library registers (the names its sources return) has its cases."""
    from collections import Counter

    from llmir_core.targets.onnxruntime.native import SOURCES

    names = set()
    for src in SOURCES:
        names |= set(re.findall(r'return "([A-Z][A-Za-z0-9]+)";', src.read_text()))
    names.discard("CPUExecutionProvider")
    per_op = Counter(c.op.split("[")[0] for c in all_cases())
    assert set(per_op) == names
    assert min(per_op.values()) >= 25, per_op
