"""No function in llmir_core or llmir_cli is longer than 80 lines without a stated reason.

A function's length is counted from its `def` line to its last line (decorators excluded;
nested functions count toward the function that holds them, and are checked on their own too).
A function longer than `MAX_LINES` states why it is one piece with a comment on the line right
after its signature, before the docstring or the first statement:

    def decode_kernel(q_ptr, k_ptr, ...):
        # long: one @triton.jit kernel; splitting it would split the program
        \"\"\"Docstring.\"\"\"

The reason after `# long:` must not be empty. A comment anywhere else does not count.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("llmir_core", "llmir_cli")
MAX_LINES = 80
_REASON = re.compile(r"#\s*long:\s*(\S.*)$")

# Functions allowed past the limit without a `# long:` reason: none ("path::qualified.name").
ALLOWED: dict[str, str] = {}


_Def = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, _Def]]:
    """Every function and method in `tree` with its qualified name (Class.method, outer.inner)."""
    found: list[tuple[str, _Def]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            found.append((name, node))
            found += _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, prefix + node.name + ".")
        else:
            found += _functions(node, prefix)
    return found


def _stated_reason(fn: _Def, lines: list[str]) -> str | None:
    """The reason of the `# long:` comment on the line right after `fn`'s signature, or None.

    The body starts at its first statement (its docstring, or a nested def's first decorator);
    the lines between the signature and the body are blank lines and comments, so the
    signature ends at the last line before them that is neither."""
    first = fn.body[0]
    start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
    sig_end = start - 1  # 1-based line number
    while sig_end > fn.lineno and (
        not lines[sig_end - 1].strip() or lines[sig_end - 1].lstrip().startswith("#")
    ):
        sig_end -= 1
    if sig_end + 1 >= start:
        return None
    match = _REASON.search(lines[sig_end].strip())  # lines[sig_end] is line sig_end + 1
    if match is None or not lines[sig_end].lstrip().startswith("#"):
        return None
    return match.group(1).strip() or None


def long_functions(root: Path = REPO) -> list[str]:
    """`path::name (N lines)` for each function over MAX_LINES with no stated reason."""
    bad = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            rel = path.relative_to(root).as_posix()
            for name, fn in _functions(ast.parse(source, filename=str(path))):
                length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
                key = f"{rel}::{name}"
                if length > MAX_LINES and key not in ALLOWED and not _stated_reason(fn, lines):
                    bad.append(f"{key} ({length} lines)")
    return bad


def test_no_long_function_without_a_reason() -> None:
    bad = long_functions()
    assert not bad, (
        f"functions over {MAX_LINES} lines: split them, or put `# long: <reason>` on the line "
        "right after the signature:\n  " + "\n  ".join(bad)
    )


def test_allowlist_names_only_long_functions() -> None:
    """An entry of ALLOWED that names no function over the limit is stale: drop it."""
    present = set()
    for key in ALLOWED:
        rel, name = key.split("::")
        path = REPO / rel
        if not path.exists():
            continue
        for qual, fn in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            if qual == name and (fn.end_lineno or fn.lineno) - fn.lineno + 1 > MAX_LINES:
                present.add(key)
    stale = sorted(set(ALLOWED) - present)
    assert not stale, "ALLOWED names functions no longer over the limit: " + ", ".join(stale)


def _write(tmp: Path, body: str) -> None:
    (tmp / "llmir_core").mkdir(exist_ok=True)
    (tmp / "llmir_cli").mkdir(exist_ok=True)
    (tmp / "llmir_core" / "m.py").write_text(body, encoding="utf-8")


def _long(header: str, comment: str = "", n: int = MAX_LINES) -> str:
    """A function of `n` lines: `header` (its signature), `comment` if any, then statements."""
    used = header.count("\n") - header.count("@") + (comment.count("\n") + 1 if comment else 0)
    body = "".join(f"    x{i} = {i}\n" for i in range(n - used))
    return header + (f"    {comment}\n" if comment else "") + body


def test_the_rule_itself(tmp_path: Path) -> None:
    """The checker counts def line to last line, takes a reason right after the signature only."""
    over = MAX_LINES + 1
    flagged = [f"llmir_core/m.py::f ({over} lines)"]
    _write(tmp_path, _long("def f():\n"))
    assert long_functions(tmp_path) == []  # exactly MAX_LINES lines
    _write(tmp_path, _long("@decorator\ndef f():\n"))
    assert long_functions(tmp_path) == []  # the decorator line is not counted
    _write(tmp_path, _long("def f():\n", n=over))
    assert long_functions(tmp_path) == flagged
    signature = "def f(\n    a: int,\n) -> None:\n"
    _write(tmp_path, _long(signature, "# long: a table", over))
    assert long_functions(tmp_path) == []
    _write(tmp_path, _long(signature, "# long: one kernel\n    'Docstring.'", over))
    assert long_functions(tmp_path) == []  # the comment goes before the docstring
    _write(tmp_path, _long("def f():\n", "# long:   ", over))
    assert long_functions(tmp_path) == flagged  # an empty reason
    _write(tmp_path, _long("def f():\n", "x = 0  # long: not on its own line", over))
    assert long_functions(tmp_path) == flagged
    _write(tmp_path, _long("def f():\n", "# setup\n    # long: not right after", over))
    assert long_functions(tmp_path) == flagged
    _write(tmp_path, _long("def f():\n", "'Docstring.'\n    # long: after the docstring", over))
    assert long_functions(tmp_path) == flagged
    method = _long("    def m(self):\n", n=over).replace("\n    ", "\n        ")
    _write(tmp_path, "class C:\n" + method)
    assert long_functions(tmp_path) == [f"llmir_core/m.py::C.m ({over} lines)"]
