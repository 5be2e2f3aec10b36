"""`llmir optimize` and `llmir verify --rules/--against`: results, errors, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli

T = "tensor<?b x 4 x f32>"
SMALL = f"""module @m attributes {{llmir.dialects = ["core"], llmir.version = "0.1"}} {{
  func.func @main(%x: {T}) -> {T} {{
    %z = core.constant {{value = dense<0.0> : tensor<f32>}} : () -> tensor<f32>
    %a = core.add %x, %z : ({T}, tensor<f32>) -> {T}
    %s = core.sigmoid %a : ({T}) -> {T}
    %y = core.mul %a, %s : ({T}, {T}) -> {T}
    return %y : {T}
  }}
}}
"""


def test_optimize_report_times_dumps_and_verify_each(tmp_path: Path) -> None:
    src, out, dumps = tmp_path / "in.llmir", tmp_path / "out.llmir", tmp_path / "d"
    src.write_text(SMALL)
    r = run_cli(
        "optimize",
        str(src),
        "-O2",
        "-o",
        str(out),
        "--verify-each",
        "--report",
        "--time-passes",
        "--print-after=lift-activations",
        "--dump-dir",
        str(dumps),
    )
    assert r.returncode == 0, r.stderr
    assert "core.silu %x" in out.read_text()
    assert "rewrites applied" in r.stdout and "add-zero at %a" in r.stdout
    assert "== pass timings ==" in r.stdout and "equivalent" in r.stdout
    dump = dumps / "05-lift-activations.llmir"
    assert (
        dump.exists()
        and "--passes canonicalize,constant-fold,cse,dce,lift-activations" in dump.read_text()
    )
    # the dump's header command reproduces it
    again = run_cli(
        "optimize", str(src), "--passes", "canonicalize,constant-fold,cse,dce,lift-activations"
    )
    assert again.stdout == "\n".join(dump.read_text().splitlines()[2:]) + "\n"
    # the output is equivalent to the input, checked from the files alone
    v = run_cli("verify", str(out), "--against", str(src))
    assert v.returncode == 0 and "equivalent" in v.stdout, v.stderr


def test_optimize_json_and_list(tmp_path: Path) -> None:
    src = tmp_path / "in.llmir"
    src.write_text(SMALL)
    r = run_cli("optimize", str(src), "--passes", "canonicalize,dce", "--format", "json")
    data = json.loads(r.stdout)
    assert data["schema_version"] == 1 and data["ok"] and data["before"]["ops"] == 4
    assert "text" in data and data["rewrites"][0]["rule"] == "add-zero"
    r = run_cli("optimize", "--list")
    assert r.returncode == 0 and "lift-rms-norm" in r.stdout and "-O2:" in r.stdout


def test_optimize_unknown_pass_and_option(tmp_path: Path) -> None:
    src = tmp_path / "in.llmir"
    src.write_text(SMALL)
    r = run_cli("optimize", str(src), "--passes", "canonicalise")
    assert r.returncode == 2 and "unknown pass 'canonicalise'" in r.stderr
    assert "valid passes: canonicalize, constant-fold" in r.stderr
    r = run_cli("optimize", str(src), "--passes", "constant-fold{limit=3}")
    assert r.returncode == 2 and "valid options: max_elements" in r.stderr
    assert "Traceback" not in r.stderr


def test_verify_against_detects_difference_and_signature(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.llmir", tmp_path / "b.llmir", tmp_path / "c.llmir"
    a.write_text(SMALL)
    b.write_text(SMALL.replace("%y = core.mul %a, %s", "%y = core.add %a, %s"))
    r = run_cli("verify", str(b), "--against", str(a))
    assert r.returncode == 1, r.stderr
    assert "not equivalent" in r.stdout and "first differing value: %y" in r.stdout
    assert f"{b}:6:" in r.stdout and f"{a}:6:" in r.stdout
    # how each op was validated: the edited add differentially, the rest by equal terms
    assert "core.add x1: differential, its operands match the original's" in r.stdout
    assert "core.sigmoid x1: smt, uninterpreted function of its operands" in r.stdout
    c.write_text(SMALL.replace(T, "tensor<?b x 5 x f32>"))
    r = run_cli("verify", str(c), "--against", str(a))
    assert r.returncode == 2 and "different signatures" in r.stderr and "argument #0" in r.stderr


def test_verify_rules_subset_and_timeout() -> None:
    r = run_cli("verify", "--rules", "--rule", "neg-neg")
    assert r.returncode == 0 and r.stdout.startswith("equivalent") and "neg-neg" in r.stdout
    r = run_cli(
        "verify", "--rules", "--rule", "fuse-gated-mlp", "--timeout", "0.001", "--format", "json"
    )
    assert r.returncode == 3
    data = json.loads(r.stdout)
    assert (
        data["rules"][0]["verdict"] == "inconclusive" and "timed out" in data["rules"][0]["detail"]
    )


def test_output_in_another_folder_keeps_weight_references(tmp_path) -> None:
    """Regression: weight paths are relative to the .llmir's folder, so `-o other/x.llmir`
    must rewrite them to still point at the same bytes."""
    import numpy as np

    from tests.conftest import run_cli

    src_dir, out_dir = tmp_path / "src", tmp_path / "out" / "deep"
    src_dir.mkdir()
    out_dir.mkdir(parents=True)
    np.arange(16, dtype=np.float32).tofile(src_dir / "w.bin")
    (src_dir / "m.llmir").write_text(
        'module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {\n'
        "  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {\n"
        '    %w = core.weight {file = "w.bin", name = "w", nbytes = 64, offset = 0} : () -> tensor<4x4xf32>\n'
        "    %y = core.matmul %x, %w : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>\n"
        "    return %y : tensor<2x4xf32>\n  }\n}\n"
    )
    r = run_cli("optimize", str(src_dir / "m.llmir"), "-O1", "-o", str(out_dir / "o.llmir"))
    assert r.returncode == 0, r.stderr
    assert 'file = "../../src/w.bin"' in (out_dir / "o.llmir").read_text()
    assert run_cli("verify", str(out_dir / "o.llmir")).returncode == 0
