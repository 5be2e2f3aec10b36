"""`llmir.toml` (what the project wants) and `llmir.lock` (exactly what was pulled).

tomllib reads both; they are written by hand as flat tables, so no TOML writer is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import tomllib

from llmir_core.errors import InputError
from llmir_core.fileio import read_text

PROJECT_FILE = "llmir.toml"
LOCK_FILE = "llmir.lock"
LOCK_VERSION = 1
DEFAULT_TARGET = "onnxruntime"
DEFAULT_OPT_LEVEL = 2
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RELOCK_HINT = "run `llmir init --force` in the project to re-pin it (rewrites llmir.lock)"


@dataclass(frozen=True)
class LockedFile:
    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Lock:
    """The resolved model: where it came from and the digest of every file."""

    ref: str
    kind: str  # "registry" | "hf" | "path"
    files: tuple[LockedFile, ...]
    repo: str | None = None
    revision: str | None = None  # as the reference or index named it
    commit: str | None = None  # what that revision resolved to
    format: str | None = None
    path: str | None = None  # kind == "path"

    def file(self, path: str) -> LockedFile | None:
        return next((f for f in self.files if f.path == path), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "kind": self.kind,
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "format": self.format,
            "path": self.path,
            "files": [f.to_json() for f in self.files],
        }


@dataclass(frozen=True)
class ProjectConfig:
    model: str
    registry: str | None = None
    target: str = DEFAULT_TARGET
    opt_level: int = DEFAULT_OPT_LEVEL


def toml_str(value: str) -> str:
    """A TOML basic string."""
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _kv(key: str, value: str | int | None) -> str | None:
    if value is None:
        return None
    return f"{key} = {value}" if isinstance(value, int) else f"{key} = {toml_str(value)}"


def _table(name: str, items: list[tuple[str, str | int | None]]) -> list[str]:
    lines = [line for key, value in items if (line := _kv(key, value)) is not None]
    return [f"[{name}]", *lines, ""]


def render_lock(lock: Lock) -> str:
    lines = [
        "# llmir.lock: written by `llmir init`; do not edit. It pins the exact model files:",
        "# `llmir init` in this folder reproduces them or fails.",
        "",
        f"lock_version = {LOCK_VERSION}",
        "",
    ]
    lines += _table(
        "model",
        [
            ("ref", lock.ref),
            ("kind", lock.kind),
            ("repo", lock.repo),
            ("revision", lock.revision),
            ("commit", lock.commit),
            ("format", lock.format),
            ("path", lock.path),
        ],
    )
    for f in lock.files:
        lines += _table("[files]", [("path", f.path), ("size", f.size), ("sha256", f.sha256)])
    return "\n".join(lines)


def render_project(config: ProjectConfig) -> str:
    lines = [
        "# llmir project: written by `llmir init`; edit freely.",
        "# The exact model files are pinned in llmir.lock.",
        "",
    ]
    lines += _table("model", [("ref", config.model), ("registry", config.registry)])
    lines += [
        "# `llmir build` and `llmir optimize` run in this folder default to these.",
        *_table("build", [("target", config.target), ("opt_level", config.opt_level)]),
    ]
    return "\n".join(lines)


def toml_error_at(path: Path, text: str, exc: Exception) -> str:
    """tomllib's message, '... (at line L, column C)' or '(at end of document)', as
    `file:line:col: not valid TOML: ...`."""
    msg = str(exc)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", msg)
    if m:
        line, col, msg = int(m[1]), int(m[2]), msg[: m.start()]
    else:
        msg = msg.removesuffix(" (at end of document)")
        lines = text.split("\n")
        line, col = len(lines), len(lines[-1]) + 1
    return f"{path}:{line}:{col}: not valid TOML: {msg}"


def _load(path: Path) -> dict[str, Any]:
    hint = f"restore it from version control, or {_RELOCK_HINT}"
    try:
        text = read_text(path)
    except InputError as exc:
        raise InputError(exc.message, hint=hint) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{toml_error_at(path, text, exc)}", hint=hint) from None
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise InputError(f"{path}: not valid TOML: nested too deeply", hint=hint) from None


def read_lock(path: Path) -> Lock:
    data = _load(path)

    def bad(why: str) -> InputError:
        return InputError(
            f"{path}: {why}", hint=f"restore llmir.lock from version control, or {_RELOCK_HINT}"
        )

    if data.get("lock_version") != LOCK_VERSION:
        raise bad(
            f"unsupported lock_version {data.get('lock_version')!r} (expected {LOCK_VERSION})"
        )
    model = data.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("ref"), str):
        raise bad("missing [model] ref")
    kind = model.get("kind")
    if kind not in ("registry", "hf", "path"):
        raise bad(f"[model] kind must be registry, hf or path, not {kind!r}")
    if kind != "path" and not isinstance(model.get("repo"), str):
        raise bad("missing [model] repo")
    files = []
    entries = data.get("files", [])
    if not isinstance(entries, list):
        raise bad("[[files]] must be an array of tables")
    for i, f in enumerate(entries):
        ok = (
            isinstance(f, dict)
            and isinstance(f.get("path"), str)
            and isinstance(f.get("size"), int)
            and isinstance(f.get("sha256"), str)
            and _SHA256.fullmatch(f["sha256"])
            and _safe_relative(f["path"])
        )
        if not ok:
            raise bad(f"[[files]] entry {i + 1} needs a relative path, a size and a 64-hex sha256")
        files.append(LockedFile(f["path"], f["size"], f["sha256"]))
    if not files:
        raise bad("no [[files]] entries")
    strings = {
        k: model.get(k) if isinstance(model.get(k), str) else None
        for k in ("repo", "revision", "commit", "format", "path")
    }
    return Lock(ref=model["ref"], kind=kind, files=tuple(files), **strings)


def _safe_relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith(("/", "\\")) and ".." not in parts


def read_project(path: Path) -> ProjectConfig:
    data = _load(path)
    model = data.get("model", {})
    if not isinstance(model, dict) or not isinstance(model.get("ref"), str):
        raise InputError(
            f"{path}: missing [model] ref",
            hint='add `[model]` with `ref = "NAME:TAG"`, or rerun `llmir init --force`',
        )
    build = data.get("build", {}) if isinstance(data.get("build"), dict) else {}
    registry = model.get("registry") if isinstance(model.get("registry"), str) else None
    if registry and "://" not in registry and not Path(registry).expanduser().is_absolute():
        registry = str(path.parent / registry)  # stored relative to the project folder
    return ProjectConfig(
        model=model["ref"],
        registry=registry,
        target=build.get("target", DEFAULT_TARGET)
        if isinstance(build.get("target"), str)
        else DEFAULT_TARGET,
        opt_level=build.get("opt_level", DEFAULT_OPT_LEVEL)
        if isinstance(build.get("opt_level"), int)
        else DEFAULT_OPT_LEVEL,
    )


def project_here(folder: Path | None = None) -> ProjectConfig | None:
    """The llmir.toml of `folder` (the working folder by default), or None outside a project:
    `llmir build` and `llmir optimize` take their defaults from its [build] table."""
    path = (folder or Path.cwd()) / PROJECT_FILE
    return read_project(path) if path.is_file() else None
