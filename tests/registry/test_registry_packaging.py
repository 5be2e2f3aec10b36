"""Generated and shipped files: completions are current and complete, the wheel would carry
every package and the index, and the Makefile example parses."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import REPO, cli

from llmir_core.registry.index import shipped_index_path


def _gen_completions():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "gen_completions", REPO / "scripts" / "gen_completions.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_completions_match_the_cli() -> None:
    gen = _gen_completions()
    for shell, name in gen.FILES.items():
        committed = (REPO / "completions" / name).read_text()
        assert committed == gen.render(shell), (
            f"completions/{name} is out of date: run python scripts/gen_completions.py"
        )


def test_completion_protocol_completes_commands_and_options(env, monkeypatch) -> None:
    monkeypatch.setenv("_LLMIR_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "llmir registry ")
    monkeypatch.setenv("COMP_CWORD", "2")
    assert set(cli().stdout.split()) >= {"list", "show", "search", "mirror"}
    monkeypatch.setenv("COMP_WORDS", "llmir init --f")
    assert {"--force", "--format"} <= set(cli().stdout.split())


def test_install_completion_writes_the_generated_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("llmir")
    if not script.is_file():
        pytest.skip("the llmir console script is not installed in this environment")
    # typer's own switch to name the shell instead of detecting the parent shell.
    env = {**os.environ, "HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    r = subprocess.run(
        [str(script), "--install-completion", "bash"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    installed = (tmp_path / ".bash_completions" / "llmir.sh").read_text()
    generated = (REPO / "completions" / "llmir.bash").read_text().split("\n", 1)[1]
    assert installed.strip() == generated.strip()
    assert "llmir.sh" in (tmp_path / ".bashrc").read_text()


def test_pyproject_ships_every_package_and_the_index() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(d.relative_to(REPO).parts)
        for top in ("llmir_core", "llmir_cli")
        for d in [REPO / top, *(REPO / top).rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }
    missing = sorted(on_disk - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"]["llmir_core.registry_index"] == "registry"
    assert "*.json" in config["package-data"]["llmir_core.registry_index"]
    assert shipped_index_path().name == "index.json"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_makefile_example_dry_run(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            "make",
            "-n",
            "-C",
            str(REPO / "examples"),
            "MODEL=smollm2:135m",
            f"PROJECT={tmp_path / 'proj'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    for step in (
        "llmir init",
        "llmir import",
        "llmir optimize",
        "llmir verify",
        "llmir build",
        "llmir bench",
    ):
        assert step in r.stdout
