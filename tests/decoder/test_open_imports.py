"""Opening and running an artifact never imports onnx (only onnxruntime): `llmir run`, `serve`
and `bench` load what someone built, and the builder's libraries are not part of that load
time. Like tests/cli/test_startup.py, each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILDER_LIBS = ("onnx", "gguf", "torch", "transformers", "z3")
# what loading a decoder needs none of: the IR, the op tables, the registry (its index and pull)
NOT_FOR_LOADING = (
    "llmir_core.ir",
    "llmir_core.dialects",
    "llmir_core.passes",
    "llmir_core.registry",
)

PRELUDE = f"""
import json, sys
def loaded(names):
    return sorted(n for n in names
                  if n in sys.modules or any(m.startswith(n + '.') for m in sys.modules))
def builder_libs():
    return loaded({BUILDER_LIBS!r})
"""


def _run(code: str, home: Path) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "LLMIR_HOME": str(home), "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_open_and_run_decoder_imports_no_onnx(tiny_artifact: Path, tmp_path: Path) -> None:
    out = _run(
        f"""
import numpy as np
from llmir_core.targets import open_artifact
dec = open_artifact({str(tiny_artifact)!r}, threads=1)
dec.reset(1)
logits = dec.forward(np.array([[1, 5, 7]], np.int64))
print(json.dumps({{"libs": builder_libs(), "shape": list(logits.shape),
                  "onnxruntime": "onnxruntime" in sys.modules,
                  "internal": loaded({NOT_FOR_LOADING!r})}}))
""",
        tmp_path,
    )
    assert out["onnxruntime"] is True
    assert out["internal"] == [], f"opening a decoder imported {out['internal']}"
    assert out["libs"] == [], f"opening an artifact imported {out['libs']}"
    assert out["shape"][0] == 1


def test_cli_run_and_bench_import_no_onnx(tiny_artifact: Path, tmp_path: Path) -> None:
    """The commands' own paths (tokenizer, generation loop, bench) included."""
    out = _run(
        f"""
from typer.testing import CliRunner
from llmir_cli.app import app
art = {str(tiny_artifact)!r}
r1 = CliRunner().invoke(app, ["run", art, "--prompt", "ab", "-n", "4", "--threads", "1"])
r2 = CliRunner().invoke(app, ["bench", art, "--prompt-len", "4", "--gen-len", "2",
                             "--runs", "1", "--threads", "1", "--format", "json"])
print(json.dumps({{"libs": builder_libs(), "codes": [r1.exit_code, r2.exit_code],
                  "out": r1.output[-500:] + r2.output[-500:]}}))
""",
        tmp_path,
    )
    assert out["codes"] == [0, 0], out["out"]
    assert out["libs"] == [], f"run/bench imported {out['libs']}"


def test_tensor_runner_imports_no_onnx(tmp_path: Path) -> None:
    """A generic (non-decoder) artifact opened as a tensor runner."""
    from llmir_core.ir.parser import parse_module
    from llmir_core.targets import build

    module = parse_module(
        'module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {\n'
        "  func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {\n"
        "    %y = core.add %x, %x : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>\n"
        "    return %y : tensor<2x3xf32>\n"
        "  }\n"
        "}\n",
        "t.llmir",
    )
    art = tmp_path / "art"
    build(module, str(art))
    out = _run(
        f"""
import numpy as np
from llmir_core.targets import open_artifact
r = open_artifact({str(art)!r})
y = r.run({{r.input_names[0]: np.ones((2, 3), np.float32)}})
print(json.dumps({{"libs": builder_libs(), "y": float(next(iter(y.values())).sum())}}))
""",
        tmp_path,
    )
    assert out["libs"] == [], f"opening a tensor artifact imported {out['libs']}"
    assert out["y"] == pytest.approx(12.0)
    assert np.isfinite(out["y"])
