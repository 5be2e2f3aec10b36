"""Targets are reached through the target table only (issue 23's acceptance: "grep finds no import
of a target from outside targets/ except the table").

The scan reads every .py under llmir_core and llmir_cli itself (ruff's per-file-ignores in
pyproject.toml hide violations from `ruff check`; this test honours none of them) and finds each
`import llmir_core.targets.<target>...`, `from llmir_core.targets.<target>... import`, `from
llmir_core.targets import <target>` (relative forms too) and `importlib.import_module("...")`
of a target module, where <target> is any folder of llmir_core/targets/. Allowed: files inside
llmir_core/targets/ and the table itself (llmir_core/targets/__init__.py). A second test checks
the ruff banned-api rule (TID251) still fires on a file under llmir_core that imports a target.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGETS_DIR = REPO / "llmir_core" / "targets"
SCANNED = ("llmir_core", "llmir_cli")
TABLE = "llmir_core/targets/__init__.py"

# Today's violators, each removed by the helper that owns the file (issue 23); the lead empties
# this list when merging. It only shrinks: an entry that no longer violates fails the test too.
ALLOWED: dict[str, str] = {}  # file -> why it may still import a target (none today)


def target_names() -> list[str]:
    """Every target folder of llmir_core/targets (one with a target.py: the target object)."""
    return sorted(p.parent.name for p in TARGETS_DIR.glob("*/target.py"))


def _absolute(node: ast.ImportFrom, rel: str) -> str:
    """The absolute module an ImportFrom names (relative levels resolved against the file)."""
    if node.level == 0:
        return node.module or ""
    package = rel.removesuffix(".py").split("/")[:-1]
    if rel.endswith("__init__.py"):
        package = rel.split("/")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target_of(module: str, targets: list[str]) -> str | None:
    """The target a dotted module name reaches into (None: not a target module)."""
    parts = module.split(".")
    if parts[:2] == ["llmir_core", "targets"] and len(parts) > 2 and parts[2] in targets:
        return parts[2]
    return None


def target_imports(source: str, rel: str, targets: list[str]) -> list[str]:
    """ "line: module" for each import of a target module in one file's source."""
    found = []
    for node in ast.walk(ast.parse(source, rel)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(node, rel)
            names = [mod] + [f"{mod}.{a.name}" for a in node.names if mod == "llmir_core.targets"]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        for name in names:
            if _target_of(name, targets):
                found.append(f"{node.lineno}: {name}")
    return found


def violations() -> dict[str, list[str]]:
    """file (relative to the repo) -> its target imports, for every file outside targets/."""
    targets = target_names()
    out: dict[str, list[str]] = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == TABLE or rel.startswith("llmir_core/targets/"):
                continue
            hits = target_imports(path.read_text(encoding="utf-8"), rel, targets)
            if hits:
                out[rel] = hits
    return out


def test_the_scan_sees_every_target_folder() -> None:
    assert {"onnxruntime", "triton"} <= set(target_names())


def test_the_scan_finds_each_import_form() -> None:
    targets = ["onnxruntime", "triton"]
    src = (
        "import llmir_core.targets.onnxruntime.session\n"
        "from llmir_core.targets.triton import runner\n"
        "from llmir_core.targets import onnxruntime\n"
        "from ..targets.onnxruntime import graph\n"
        "import importlib\n"
        "importlib.import_module('llmir_core.targets.triton.aot')\n"
        "def f():\n"
        "    from llmir_core.targets.onnxruntime.session import BuildError\n"
        "from llmir_core.targets import get_target, TARGETS\n"
        "from llmir_core.targets.contract import Capabilities\n"
        "import llmir_core.targets\n"
    )
    hits = target_imports(src, "llmir_core/runtime/x.py", targets)
    assert [h.split(":")[0] for h in hits] == ["1", "2", "3", "4", "6", "8"]


def test_no_target_imported_from_outside_targets() -> None:
    found = violations()
    new = {f: h for f, h in found.items() if f not in ALLOWED}
    assert not new, (
        "import a target through the table (llmir_core.targets: get_target, build, "
        "open_artifact...), not directly:\n"
        + "\n".join(f"{f}:{h}" for f, hits in sorted(new.items()) for h in hits)
    )
    fixed = sorted(set(ALLOWED) - set(found))
    assert not fixed, f"no longer import a target: drop them from ALLOWED: {', '.join(fixed)}"


def _ruff() -> str:
    found = Path(sys.executable).parent / "ruff"
    path = str(found) if found.exists() else shutil.which("ruff")
    if path is None:
        pytest.fail("ruff is not installed (pip install -e '.[test]')")
    return path


def test_ruff_bans_a_target_import_in_core(tmp_path: Path) -> None:
    """The banned-api rule in pyproject.toml fires for a core module importing any target (ruff
    reads the repo's config for a file under llmir_core/, wherever its bytes come from)."""
    rel = "llmir_core/runtime/_boundary_probe.py"
    probe = tmp_path / "probe.py"
    for target in target_names():
        probe.write_text(
            f'"""probe."""\n\nfrom llmir_core.targets.{target} import target\n\n'
            "__all__ = ['target']\n"
        )
        r = subprocess.run(
            [_ruff(), "check", "--no-cache", "--select", "TID251"] + ["--stdin-filename", rel, "-"],
            input=probe.read_text(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and "TID251" in r.stdout, (target, r.stdout + r.stderr)
