"""Every command's --help shows plain placeholders (FILE, PATH, TEXT, INTEGER, human|json), never
typer's internals (`<list[str]>`, `<int range>`, `<path>`, `{src}`)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from llmir_cli.app import COMMANDS, app, load_command

INTERNALS = re.compile(r"<[a-z][a-z \[\]|]*>|\{[a-z_]+\}|list\[")


def _all_commands() -> list[list[str]]:
    out = []
    for name in COMMANDS:
        sub = getattr(load_command(name), "commands", {})
        out += [[name, s] for s in sub] if sub else [[name]]
    return out


@pytest.mark.parametrize("argv", _all_commands(), ids=lambda a: " ".join(a))
def test_help_has_plain_placeholders(argv: list[str]) -> None:
    r = CliRunner().invoke(app, [*argv, "--help"], prog_name="llmir")
    assert r.exit_code == 0, r.output
    usage = r.output.splitlines()[0]
    assert usage.startswith(f"Usage: llmir {' '.join(argv)} [OPTIONS]"), usage
    rows = [
        line
        for line in r.output.splitlines()
        if line.startswith("  ") and not line.startswith("    ")
    ]
    bad = [line for line in [usage, *rows] if INTERNALS.search(line)]
    assert not bad, bad


def test_placeholders_by_kind() -> None:
    out = CliRunner().invoke(app, ["import", "--help"], prog_name="llmir").output
    assert out.splitlines()[0] == "Usage: llmir import [OPTIONS] SRC"
    assert "-o, --output PATH" in out and "-f, --format human|json" in out
    out = CliRunner().invoke(app, ["init", "--help"], prog_name="llmir").output
    assert "-O, --opt-level INTEGER" in out and "[0<=x<=3]" in out
    out = CliRunner().invoke(app, ["registry", "mirror", "--help"], prog_name="llmir").output
    assert out.splitlines()[0] == "Usage: llmir registry mirror [OPTIONS] DIRECTORY NAME:TAG..."
    out = CliRunner().invoke(app, ["run", "--help"], prog_name="llmir").output
    assert "-i, --input TEXT" in out and "-n, --max-new-tokens INTEGER" in out
