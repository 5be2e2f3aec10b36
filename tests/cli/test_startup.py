"""Startup stays light: `import llmir_cli.app` (what `--version` and `--help` pay) loads no heavy
library and no command module; a command loads only its own module; z3, onnx, onnxruntime, gguf,
huggingface_hub and tokenizers load on first use. benchmarks/startup.py prints the times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from llmir_cli.app import COMMANDS, app, load_command

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = (
    "z3",
    "onnx",
    "onnxruntime",
    "gguf",
    "huggingface_hub",
    "tokenizers",
    "httpx2",
    "torch",
    "transformers",
    "triton",
    "jinja2",
)
# What `--version`/`--help` must not pay for either: numpy, rich, the IR, the op, pass and rule tables.
STARTUP_FREE = (
    *LIBRARIES,
    "numpy",
    "rich",
    "pydantic",
    "llmir_core.ir",
    "llmir_core.dialects",
    "llmir_core.passes",
    "llmir_core.rewrite",
    "llmir_core.smt",
    "llmir_core.registry",
)


def _loaded_after(code: str) -> dict[str, object]:
    """Run `code` in a fresh interpreter; return its printed JSON (code ends by printing one)."""
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


PRELUDE = """
import json, sys
def loaded(names):
    return sorted(n for n in names if n in sys.modules or any(m.startswith(n + '.') for m in sys.modules))
"""


def test_version_and_help_load_nothing_heavy() -> None:
    out = _loaded_after(
        PRELUDE
        + f"""
import llmir_cli.app
after_import = loaded({STARTUP_FREE!r})
from typer.testing import CliRunner
r = CliRunner().invoke(llmir_cli.app.app, ["--help"])
v = CliRunner().invoke(llmir_cli.app.app, ["--version"])
print(json.dumps({{"import": after_import, "help": loaded({STARTUP_FREE!r}),
                  "commands": sorted(m for m in sys.modules if m.startswith("llmir_cli.commands.")),
                  "help_text": r.output, "version": v.output}}))
"""
    )
    assert out["import"] == [] and out["help"] == [], out
    assert out["commands"] == [], "--help imported command modules"
    assert str(out["version"]).startswith("llmir ")
    lines = str(out["help_text"]).splitlines()
    for name, (_, short) in COMMANDS.items():
        assert any(line.split() == [name, *short.split()] for line in lines), (
            name,
            out["help_text"],
        )


def test_each_command_loads_only_its_own_module_and_no_library() -> None:
    out = _loaded_after(
        PRELUDE
        + f"""
from llmir_cli.app import COMMANDS, load_command
res = {{}}
for name in COMMANDS:
    cmd = load_command(name)
    res[name] = [cmd.name, cmd.short_help]
res["libraries"] = loaded({LIBRARIES!r})
print(json.dumps(res))
"""
    )
    assert out.pop("libraries") == [], "a command module imports a heavy library at load time"
    for name, (_, short) in COMMANDS.items():
        assert out[name] == [name, short]


def test_verify_and_optimize_never_load_the_solver_or_onnx() -> None:
    example = REPO / "examples" / "decoder.llmir"
    out = _loaded_after(
        PRELUDE
        + f"""
import tempfile, os
from typer.testing import CliRunner
from llmir_cli.app import app
d = tempfile.mkdtemp()
codes = [CliRunner().invoke(app, ["optimize", {str(example)!r}, "-O3", "-o", os.path.join(d, "o.llmir")]).exit_code,
         CliRunner().invoke(app, ["verify", os.path.join(d, "o.llmir")]).exit_code,
         CliRunner().invoke(app, ["fmt", {str(example)!r}]).exit_code]
print(json.dumps({{"codes": codes, "libraries": loaded({LIBRARIES!r})}}))
"""
    )
    assert out == {"codes": [0, 0, 0], "libraries": []}


def test_a_mistyped_command_gets_a_suggestion_from_the_whole_table() -> None:
    r = CliRunner().invoke(app, ["regsitry"])
    assert r.exit_code == 2 and "No such command 'regsitry'. Did you mean 'registry'?" in r.output


def test_a_command_help_shows_the_module_help() -> None:
    r = CliRunner().invoke(app, ["build", "--help"])
    assert r.exit_code == 0 and "Build a .llmir module into an artifact folder" in r.output
    assert load_command("build") is load_command("build")  # built once per process
