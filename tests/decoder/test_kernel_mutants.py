"""The kernel tests can fail: scripts/mutate_kernels.py's CI subset (a dropped eps in the C and
Triton RMS norms, a wrong soft-cap, a swapped zero-point nibble order, silu with e^g, swapped
rotary halves) is killed by the kernel tests, each mutant compiled into its own copy of the
package. The whole list runs on demand (`python scripts/mutate_kernels.py`, docs/testing.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmir_core.targets.onnxruntime.native import unavailable_reason
from tests.conftest import import_or_skip, requires

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import mutate_kernels  # noqa: E402

WHY = unavailable_reason()


def test_every_snippet_is_found_once() -> None:
    """The list matches the sources (another change to a kernel fails here, not at run time)."""
    assert mutate_kernels.snippet_problems(mutate_kernels.MUTANTS) == []
    names = [m.name for m in mutate_kernels.MUTANTS]
    assert len(names) == len(set(names)) >= 30
    assert sum(m.file.startswith(mutate_kernels.T_DIR) for m in mutate_kernels.MUTANTS) >= 6
    for m in mutate_kernels.MUTANTS:
        for t in m.tests:
            path, _, name = t.partition("::")
            assert f"def {name}(" in (REPO / path).read_text(), t


def test_a_missing_snippet_is_an_error(tmp_path: Path) -> None:
    bad = mutate_kernels.Mutant("x", mutate_kernels.C_DIR + "norm.c", "no such code", "", (), "")
    (msg,) = mutate_kernels.snippet_problems([bad])
    assert "snippet found 0 times" in msg


@pytest.mark.slow
@requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
def test_the_ci_subset_is_killed() -> None:
    import_or_skip("triton", "the Triton mutants need triton")
    r = subprocess.run(
        [sys.executable, "scripts/mutate_kernels.py", "--subset", "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["total"] == report["killed"] >= 6, report
