"""Shared by the bad-input tests: the CLI run in this process, and checks every bad input must pass."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from click.testing import CliRunner

from llmir_cli.app import app

COMMAND = typer.main.get_command(app)  # built once: typer's runner rebuilds it on every call


def invoke(*args: str, input: str | None = None) -> tuple[int, str, str]:
    """Run `llmir ARGS` in this process; an exception escaping the command fails the test."""
    r = CliRunner().invoke(COMMAND, list(args), input=input)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


def rejected(
    code: int, err: str, *, expect: int | tuple[int, ...] = (1, 2), names: str | None = None
) -> str:
    """Assert a clean rejection: the exit code, one `error:` line (naming `names`), no traceback,
    no internal error. Returns the error line."""
    codes = (expect,) if isinstance(expect, int) else expect
    assert code in codes, f"exit {code}: {err}"
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert lines, err
    if names is not None:
        assert names in lines[0], lines[0]
    return lines[0]


def listing(folder: Path) -> set[str]:
    """Every path under `folder` (to check that nothing was left behind)."""
    out = set()
    for d, dirs, files in os.walk(folder):
        out.update(os.path.relpath(os.path.join(d, f), folder) for f in dirs + files)
    return out
