"""Fixtures of the reference-target tests: the tiny decoder imported to a .llmir file and built
with `llmir build --target reference` (tests/decoder and tests/serve import them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app


def invoke(*args: object) -> tuple[int, str, str]:
    """`llmir ARGS` in-process: (exit code, stdout, stderr)."""
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="session")
def tiny_llmir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref_src") / "m.llmir"
    code, _, err = invoke("import", tiny_dir, "-o", out)
    assert code == 0, err
    return out


@pytest.fixture(scope="session")
def ref_artifact(tiny_llmir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref_art") / "r"
    code, _, err = invoke("build", tiny_llmir, "--target", "reference", "-o", out)
    assert code == 0, err
    return out
