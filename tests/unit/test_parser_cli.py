"""`llmir verify` / `llmir fmt` on malformed input: a located diagnostic and exit 2, never a traceback.

Runs the CLI in-process (click's CliRunner on the typer app's command) over every parser error case, garbage bytes and
truncations of a valid file; two cases also run as real subprocesses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from click.testing import CliRunner

from llmir_cli.app import app
from tests.conftest import run_cli
from tests.unit.test_parser_errors import CASES, _locate

GOOD = (Path(__file__).resolve().parents[2] / "examples" / "decoder.llmir").read_text()


COMMAND = typer.main.get_command(app)  # built once: typer's runner rebuilds it on every call


def _invoke(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(COMMAND, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception  # an exception escaped the command: that is the bug this file hunts
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("marked", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_verify_parse_error_is_located(tmp_path: Path, marked: str) -> None:
    text, line, col = _locate(marked)
    f = tmp_path / "bad.llmir"
    f.write_text(text, encoding="utf-8")
    code, out, err = _invoke("verify", str(f))
    assert code == 2, err
    assert "Traceback" not in out + err and "internal error" not in err
    assert err.startswith(f"{f}:{line}:{col}: error: ")
    assert "\nhint: " in err


def test_fmt_parse_error_json(tmp_path: Path) -> None:
    text, line, col = _locate(CASES[0][1])
    f = tmp_path / "bad.llmir"
    f.write_text(text, encoding="utf-8")
    code, out, _ = _invoke("fmt", str(f), "--format", "json")
    assert code == 2
    data = json.loads(out)
    (diag,) = data["diagnostics"]
    assert (diag["file"], diag["line"], diag["col"]) == (str(f), line, col)
    assert data["exit_code"] == 2 and data["schema_version"] == 1


@pytest.mark.parametrize("cut", range(0, len(GOOD), max(1, len(GOOD) // 40)))
def test_truncated_file_never_crashes(tmp_path: Path, cut: int) -> None:
    f = tmp_path / "cut.llmir"
    f.write_text(GOOD[:cut], encoding="utf-8")
    for command in ("verify", "fmt"):
        code, out, err = _invoke(command, str(f))
        assert code in (0, 1, 2), (command, cut, err)
        assert "Traceback" not in out + err and "internal error" not in err


def test_garbage_bytes(tmp_path: Path) -> None:
    f = tmp_path / "garbage.llmir"
    f.write_bytes(bytes(range(256)))
    code, _, err = _invoke("verify", str(f))
    assert code == 2 and "not UTF-8" in err


def test_subprocess_parse_error_has_caret_and_no_traceback(tmp_path: Path) -> None:
    marked = [c[1] for c in CASES if c[0] == "undefined_operand"][0]
    text, line, col = _locate(marked)
    f = tmp_path / "bad.llmir"
    f.write_text(text, encoding="utf-8")
    r = run_cli("verify", str(f))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == f"{f}:{line}:{col}: error: use of undefined value %nope"
    assert lines[1] == "  " + text.split("\n")[line - 1]
    assert lines[2] == "  " + " " * (col - 1) + "^"


def test_subprocess_verify_failure_exit_1(tmp_path: Path) -> None:
    f = tmp_path / "bad.llmir"
    t = "tensor<4xf32>"
    f.write_text(
        'module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {\n'
        f"  func.func @f(%x: {t}) -> {t} {{\n    %y = core.silly %x : ({t}) -> {t}\n"
        f"    return %y : {t}\n  }}\n}}\n",
        encoding="utf-8",
    )
    r = run_cli("verify", str(f))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert lines[:3] == [
        f"{f}:3:10: error: unknown op 'core.silly'",
        f"      %y = core.silly %x : ({t}) -> {t}",
        "           ^",
    ]
    assert lines[3].startswith("  note: did you mean core.silu")
