"""onnxruntime's own log lines (ANSI-coloured, deaf to NO_COLOR) never reach llmir's stderr: its
failures arrive as exceptions, which llmir reports in one plain line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A model onnxruntime warns about when it loads (an initializer no node uses).
MODEL = """
from onnx import TensorProto as T, helper as h
g = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g",
                 [h.make_tensor_value_info("x", T.FLOAT, [2])], [h.make_tensor_value_info("y", T.FLOAT, [2])],
                 initializer=[h.make_tensor("unused", T.FLOAT, [1], [1.0])])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
"""


@pytest.mark.parametrize(
    "load",
    [
        "from llmir_core.targets.onnxruntime.session import _session\n_session(m)\nimport onnxruntime as ort\n"
        "ort.InferenceSession(m, providers=['CPUExecutionProvider'])",
        "from llmir_core.targets.onnxruntime.runner import _ort\nort = _ort()\n"
        "ort.InferenceSession(m, providers=['CPUExecutionProvider'])",
        "import onnxruntime as ort\nort.InferenceSession(m, providers=['CPUExecutionProvider'])",
    ],
    ids=["backend", "runtime", "plain-onnxruntime-warns"],
)
def test_no_onnxruntime_log_lines(load: str) -> None:
    code = MODEL + textwrap.dedent(load)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    if load.startswith("import onnxruntime"):
        assert "Removing initializer" in r.stderr  # the control: onnxruntime alone does warn
    else:
        assert r.stderr == "", r.stderr
