"""The `llmir verify` / `llmir fmt` contract: results, diagnostics, exit codes, no tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli

GOOD = """module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {
  func.func @main(%x: tensor<?batch x 4 x f32>, %w: tensor<4x4xf32>) -> tensor<?batch x 4 x f32> {
    %y = core.matmul %x, %w {transpose_b = true} : (tensor<?batch x 4 x f32>, tensor<4x4xf32>) -> tensor<?batch x 4 x f32>
    return %y : tensor<?batch x 4 x f32>
  }
}
"""


def test_version() -> None:
    r = run_cli("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("llmir ")


def test_verify_ok(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text(GOOD)
    r = run_cli("verify", str(f))
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_verify_type_error_exit_1_with_location(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text(
        GOOD.replace(
            "-> tensor<?batch x 4 x f32>\n    return", "-> tensor<?batch x 5 x f32>\n    return"
        )
        .replace("return %y : tensor<?batch x 4 x f32>", "return %y : tensor<?batch x 5 x f32>")
        .replace(") -> tensor<?batch x 4 x f32> {", ") -> tensor<?batch x 5 x f32> {")
    )
    r = run_cli("verify", str(f))
    assert r.returncode == 1
    assert f"{f}:3:" in r.stderr
    assert "declared tensor<?batch x 5 x f32>" in r.stderr
    assert "Traceback" not in r.stderr


def test_verify_parse_error_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text(GOOD.replace("%y = core.matmul %x", "%y = core.matmul %nope"))
    r = run_cli("verify", str(f))
    assert r.returncode == 2
    assert f"{f}:3:22: error: use of undefined value %nope" in r.stderr
    assert "Traceback" not in r.stderr


def test_verify_json(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text(GOOD)
    r = run_cli("verify", str(f), "--format", "json")
    data = json.loads(r.stdout)
    assert data["schema_version"] == 1 and data["ok"] is True


def test_verify_missing_file_exit_2() -> None:
    r = run_cli("verify", "/nonexistent/x.llmir")
    assert r.returncode == 2
    assert "no such file" in r.stderr


def test_bad_flag_exit_2(tmp_path: Path) -> None:
    r = run_cli("verify", "--bogus")
    assert r.returncode == 2


def test_fmt_roundtrip_and_in_place(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text(GOOD.replace("    %y", "      %y"))
    r = run_cli("fmt", str(f))
    assert r.returncode == 0
    assert r.stdout == GOOD
    assert run_cli("fmt", "--check", str(f)).returncode == 1
    assert run_cli("fmt", "-i", str(f)).returncode == 0
    assert f.read_text() == GOOD
    assert run_cli("fmt", "--check", str(f)).returncode == 0
