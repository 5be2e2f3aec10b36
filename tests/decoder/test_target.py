"""The onnxruntime target as a lowering: optimize --target shows ort ops and validates each pass,
its build is byte-identical to building the import, a wrong lowering is caught, and the
capability table names what the target cannot run."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmir_core.ir.printer import print_module
from tests.conftest import run_cli


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


@pytest.fixture(scope="module")
def lowered(tiny_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lowered")
    (d / "m.llmir").write_text(print_module(tiny_module))
    r = _cli("optimize", "m.llmir", "--target", "onnxruntime", "--verify-each", "--report", "-o", "l.llmir", cwd=d)
    assert r.returncode == 0, r.stderr
    assert "group-query-attention" in r.stdout and "packed QKV" in r.stdout
    assert r.stdout.count("equivalent (") == 4  # every lowering pass validated
    return d


def test_lowered_file_shows_target_ops(lowered: Path) -> None:
    text = (lowered / "l.llmir").read_text()
    for op in ("ort.group_query_attention", "ort.skip_simplified_layer_norm", "ort.fused_matmul", "ort.quick_gelu"):
        assert op in text
    assert "llm.scaled_dot_product_attention" not in text and 'target = "onnxruntime"' in text


def test_build_of_lowered_is_byte_identical(lowered: Path) -> None:
    assert _cli("build", "m.llmir", "-o", "A", cwd=lowered).returncode == 0
    assert _cli("build", "l.llmir", "-o", "B", cwd=lowered).returncode == 0
    names = sorted(p.name for p in (lowered / "A").iterdir())
    assert names == sorted(p.name for p in (lowered / "B").iterdir())
    for n in names:
        assert (lowered / "A" / n).read_bytes() == (lowered / "B" / n).read_bytes(), n


@pytest.mark.parametrize("edit", [("kv_num_heads = 2", "kv_num_heads = 1"), ("epsilon = 1e-05", "epsilon = 0.001"),
                                  ("do_rotary = true", "do_rotary = false")])
def test_edited_lowered_op_is_caught(lowered: Path, edit: tuple[str, str]) -> None:
    """Edit one attribute of the first lowered op that has it: not equivalent, exit 1, op named."""
    text = (lowered / "l.llmir").read_text()
    assert edit[0] in text
    (lowered / "bad.llmir").write_text(text.replace(edit[0], edit[1], 1))
    r = _cli("verify", "bad.llmir", "--against", "m.llmir", cwd=lowered)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "ort." in out and "bad.llmir:" in out


def test_verify_target_lists_unsupported_ops(tmp_path: Path) -> None:
    (tmp_path / "d.llmir").write_text(
        'module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {\n'
        '  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32, device="cuda"> {\n'
        '    %y = llm.to_device %x {device = "cuda"} : (tensor<4xf32>) -> tensor<4xf32, device="cuda">\n'
        "    return %y : tensor<4xf32, device=\"cuda\">\n  }\n}\n")
    r = _cli("verify", "d.llmir", "--target", "onnxruntime", cwd=tmp_path)
    assert r.returncode == 1
    assert "d.llmir:3:" in r.stderr and "llm.to_device cannot run here" in r.stderr
    assert _cli("verify", "d.llmir", "--target", "nope", cwd=tmp_path).returncode == 2


def test_unknown_target_is_an_input_error(tmp_path: Path, lowered: Path) -> None:
    r = _cli("optimize", "m.llmir", "--target", "nope", "-o", "x.llmir", cwd=lowered)
    assert r.returncode == 2 and "unknown target 'nope'" in r.stderr
