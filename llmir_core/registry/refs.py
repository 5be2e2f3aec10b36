"""Model references: `name:tag` (the index), `hf:ORG/REPO[/FILE][@REV]` (the hub), or a PATH."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llmir_core.errors import InputError

COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*(:[a-z0-9][a-z0-9._-]*)?")
_REPO_PART_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")
DEFAULT_TAG = "latest"
DEFAULT_REVISION = "main"
HF_SYNTAX = "hf:ORG/REPO, hf:ORG/REPO@REVISION or hf:ORG/REPO/FILE.gguf@REVISION"


@dataclass(frozen=True)
class RegistryRef:
    name: str  # always name:tag

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class HfRef:
    repo: str
    revision: str = DEFAULT_REVISION
    file: str | None = None

    def __str__(self) -> str:
        file = f"/{self.file}" if self.file else ""
        return f"hf:{self.repo}{file}@{self.revision}"


@dataclass(frozen=True)
class PathRef:
    path: Path

    def __str__(self) -> str:
        return str(self.path)


ModelRef = RegistryRef | HfRef | PathRef


def parse_ref(ref: str) -> ModelRef:
    """Classify a reference; a bare `name` means `name:latest`, as in ollama."""
    text = ref.strip()
    if not text:
        raise InputError(
            "empty model reference",
            hint=f"pass NAME:TAG from `llmir registry list`, {HF_SYNTAX}, or a PATH",
        )
    if text.startswith("hf:"):
        return _parse_hf(text)
    if text.startswith(_PATH_PREFIXES):
        return _existing_path(text)
    if _NAME_RE.fullmatch(text.lower()) and not Path(text).exists():
        name = text.lower()
        return RegistryRef(name if ":" in name else f"{name}:{DEFAULT_TAG}")
    return _existing_path(text)


def _existing_path(text: str) -> PathRef:
    path = Path(text).expanduser()
    if not path.exists():
        hint = (
            f"for a hub repository write hf:{text}"
            if text.count("/") == 1 and not text.startswith(_PATH_PREFIXES)
            else f"check the path, or pass NAME:TAG from `llmir registry list` or {HF_SYNTAX}"
        )
        raise InputError(f"no such file or folder: {text}", hint=hint)
    return PathRef(path.resolve())


def _parse_hf(text: str) -> HfRef:
    body = text[3:]
    revision = DEFAULT_REVISION
    if "@" in body:
        body, revision = body.rsplit("@", 1)
    parts = body.split("/")
    ok = (
        len(parts) >= 2
        and all(_REPO_PART_RE.fullmatch(p) for p in parts[:2])
        and revision
        and all(parts[2:])
        and ".." not in parts
    )
    if not ok:
        raise InputError(f"malformed hub reference {text!r}", hint=f"write {HF_SYNTAX}")
    return HfRef(repo="/".join(parts[:2]), revision=revision, file="/".join(parts[2:]) or None)
