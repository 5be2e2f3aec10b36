"""The FileCheck driver: runs every `*.llmir` test under tests/filecheck/ (lit, reduced).

A test file carries its commands in `// RUN:` lines (a line ending in `\\` continues on the
next `// RUN:` line). Substitutions: `%s` the test file, `%S` its folder, `%t` a scratch path
unique to the case, `%%` a literal `%`. Commands run in bash from the repository root with
`set -o pipefail` and the running interpreter's bin folder first on PATH, so `llmir` and
`filecheck` (the `filecheck` PyPI package) are the ones installed with this llmir.
`not CMD` succeeds when CMD fails with an exit status from 1 to 63 (a check failed, bad input):
an internal error (70) or a signal still fails the test, like lit's `not` without `--crash`.

Split files: a RUN line containing `--split-input-file` makes the *driver* cut the file at
`// -----` lines into cases; each case is written to a scratch copy padded with blank lines, so
line numbers (and `[[# @LINE]]` expressions) are those of the original file, and the RUN lines
run once per case with `%s` naming that copy and the flag removed (llmir has no such flag).
Every file or case is one pytest test, named by its path (and `#N` for the N-th case).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SPLIT_FLAG = "--split-input-file"
SEPARATOR = re.compile(r"^\s*// -----\s*$")
RUN = re.compile(r"^\s*//\s*RUN:(.*)$")
BIN = os.path.dirname(sys.executable)
PRELUDE = """set -o pipefail
not() { "$@"; local rc=$?; [ "$rc" -ge 1 ] && [ "$rc" -le 63 ]; }
"""


@dataclass(frozen=True)
class Case:
    path: Path
    index: int  # 0 when the file is not split
    first_line: int  # 1-based line of the case in the file
    text: str  # the case, padded with blank lines to keep the file's line numbers
    commands: tuple[str, ...]

    @property
    def id(self) -> str:
        rel = self.path.relative_to(HERE).as_posix()
        return f"{rel}#{self.index}" if self.index else rel


def run_lines(text: str) -> list[str]:
    commands, pending = [], ""
    for line in text.splitlines():
        m = RUN.match(line)
        if not m:
            continue
        part = m.group(1).strip()
        if part.endswith("\\"):
            pending += part[:-1] + " "
            continue
        commands.append(pending + part)
        pending = ""
    if pending:
        commands.append(pending)
    return commands


def cases_of(path: Path) -> list[Case]:
    text = path.read_text(encoding="utf-8")
    commands = run_lines(text)
    if not any(SPLIT_FLAG in c for c in commands):
        return [Case(path, 0, 1, text, tuple(commands))]
    commands = [c.replace(SPLIT_FLAG, "") for c in commands]
    lines = text.split("\n")
    out, start = [], 0
    bounds = [i for i, line in enumerate(lines) if SEPARATOR.match(line)] + [len(lines)]
    for n, end in enumerate(bounds, 1):
        body = "\n" * start + "\n".join(lines[start:end]) + "\n"
        out.append(Case(path, n, start + 1, body, tuple(commands)))
        start = end + 1
    return out


def all_cases() -> list[Case]:
    return [c for p in sorted(HERE.rglob("*.llmir")) for c in cases_of(p)]


def substitute(command: str, file: Path, scratch: Path) -> str:
    out = command.replace("%%", "\0")
    out = out.replace("%s", str(file)).replace("%S", str(file.parent)).replace("%t", str(scratch))
    return out.replace("\0", "%")


CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_filecheck(case: Case, tmp_path: Path) -> None:
    assert case.commands, f"{case.path}: no `// RUN:` line"
    file = case.path
    if case.index:
        file = tmp_path / case.path.name
        file.write_text(case.text, encoding="utf-8")
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "NO_COLOR": "1"}
    for i, command in enumerate(case.commands):
        script = substitute(command, file, tmp_path / f"{case.path.stem}.tmp{i}")
        r = subprocess.run(
            ["bash", "-c", PRELUDE + script],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r.returncode != 0:
            pytest.fail(
                f"{case.path}:{case.first_line}: RUN failed (exit {r.returncode}):\n"
                f"  {script}\n--- stdout ---\n{r.stdout[-4000:]}\n"
                f"--- stderr ---\n{r.stderr[-6000:]}",
                pytrace=False,
            )


def test_driver_splits_and_keeps_line_numbers(tmp_path: Path) -> None:
    f = tmp_path / "t.llmir"
    f.write_text("// RUN: llmir fmt %s --split-input-file | filecheck %s\na\n// -----\nb\nc\n")
    first, second = cases_of(f)
    assert first.commands == second.commands == ("llmir fmt %s  | filecheck %s",)
    assert first.text == "// RUN: llmir fmt %s --split-input-file | filecheck %s\na\n"
    assert second.text.split("\n")[3:5] == ["b", "c"] and second.first_line == 4
    assert substitute("a %s %% %t", f, tmp_path / "x") == f"a {f} % {tmp_path / 'x'}"


def test_every_registered_op_has_a_golden() -> None:
    from tests.filecheck.gen_op_goldens import missing_ops

    missing = missing_ops()
    assert not missing, (
        f"no golden parse/print test for {', '.join(missing)}: run "
        "`python tests/filecheck/gen_op_goldens.py` and review the new checks"
    )
