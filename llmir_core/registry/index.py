"""The model index: loading it (shipped, a file, a directory mirror or a URL), checking it
against its schema, and looking names up.

Which index is used: `--registry PATH_OR_URL` if given, else `LLMIR_REGISTRY`, else the index
shipped with llmir. A directory holds `index.json`; when it also holds `blobs/`, it is a mirror
that serves each file as `blobs/<sha256>`, with no network at all.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from llmir_core.errors import Diagnostic, InputError, SourcePos
from llmir_core.fileio import read_text, write_text_atomic

from . import jsonpos
from .home import llmir_home
from .schema import SchemaError, path_text, validate

INDEX_NAME = "index.json"
SCHEMA_NAME = "index.schema.json"
MAX_DIAGNOSTICS = 10


@dataclass(frozen=True)
class FileSpec:
    """One file of a model; sha256/size None means the index does not pin it."""

    path: str
    sha256: str | None
    size: int | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class Entry:
    """One `name:tag` of the index."""

    name: str
    description: str
    repo: str
    revision: str
    format: str
    quantization: str
    license: str
    parameters: int
    files: tuple[FileSpec, ...]
    include: tuple[str, ...] = ()
    notes: str | None = None

    @property
    def pinned(self) -> bool:
        """Every listed file has a digest and nothing is left to patterns."""
        return all(f.sha256 for f in self.files) and not self.include

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": {"hf": self.repo, "revision": self.revision},
            "format": self.format,
            "quantization": self.quantization,
            "license": self.license,
            "parameters": self.parameters,
            "files": [f.to_json() for f in self.files],
            "include": list(self.include),
            "notes": self.notes,
            "pinned": self.pinned,
        }


@dataclass(frozen=True)
class Index:
    """A loaded, validated index and where it came from."""

    origin: str  # "shipped", a path or a URL, for messages
    kind: str  # "shipped" | "file" | "directory" | "url"
    path: Path  # the local file read (for a URL: the cached copy)
    entries: dict[str, Entry] = field(default_factory=dict)
    mirror: Path | None = None  # a folder holding blobs/<sha256>

    def get(self, name: str) -> Entry:
        entry = self.entries.get(name)
        if entry is not None:
            return entry
        close = suggestions(name, list(self.entries))
        hint = (
            f"did you mean {' or '.join(close)}? `llmir registry list` shows every model"
            if close
            else "`llmir registry search WORD` finds models; use hf:ORG/REPO or a local PATH "
            "for a model that is not in the index"
        )
        raise InputError(f"unknown model {name!r} in the {self.describe()}", hint=hint)

    def search(self, word: str) -> list[Entry]:
        needle = word.lower()
        return [
            e
            for e in self.entries.values()
            if any(
                needle in text.lower()
                for text in (e.name, e.description, e.repo, e.format, e.quantization, e.license)
            )
        ]

    def blob(self, sha256: str) -> Path | None:
        if self.mirror is None:
            return None
        candidate = self.mirror / "blobs" / sha256
        return candidate if candidate.is_file() else None

    def describe(self) -> str:
        return "shipped index" if self.kind == "shipped" else f"index {self.origin}"


def suggestions(name: str, names: list[str], limit: int = 4) -> list[str]:
    """Close names: difflib's best matches, then other tags of the same model name."""
    close = difflib.get_close_matches(name, names, n=limit, cutoff=0.6)
    base = name.split(":", 1)[0]
    same = sorted(n for n in names if n.split(":", 1)[0] == base)
    out: list[str] = []
    for candidate in close + same:
        if candidate not in out:
            out.append(candidate)
    return out[:limit]


def shipped_index_path() -> Path:
    """The index inside the installed package, or registry/ beside the source tree."""
    try:
        found = resources.files("llmir_core.registry_index") / INDEX_NAME
        if found.is_file():
            return Path(str(found))
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parents[2] / "registry" / INDEX_NAME


def schema() -> dict[str, Any]:
    path = shipped_index_path().with_name(SCHEMA_NAME)
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def registry_source(registry: str | None) -> str | None:
    """The explicit registry: the argument, else LLMIR_REGISTRY, else None (shipped)."""
    return registry or os.environ.get("LLMIR_REGISTRY") or None


def load_index(registry: str | None = None, *, offline: bool = False) -> Index:
    """Load and validate the index named by `registry` / LLMIR_REGISTRY / the shipped one."""
    source = registry_source(registry)
    if source is None:
        path = shipped_index_path()
        return _from_file(path, origin="shipped", kind="shipped")
    if source.startswith(("http://", "https://")):
        return _from_url(source, offline=offline)
    path = Path(source).expanduser()
    if path.is_dir():
        index_file = path / INDEX_NAME
        if not index_file.is_file():
            raise InputError(
                f"registry folder {path} has no {INDEX_NAME}",
                hint="point --registry at a folder holding index.json "
                "(a mirror written by `llmir registry mirror`) or at an index file",
            )
        mirror = path if (path / "blobs").is_dir() else None
        return _from_file(index_file, origin=str(path), kind="directory", mirror=mirror)
    if path.is_file():
        return _from_file(path, origin=str(path), kind="file")
    raise InputError(
        f"registry {source} does not exist",
        hint="pass an index file, a mirror folder or an http(s) URL to --registry "
        "(or LLMIR_REGISTRY), or unset it to use the shipped index",
    )


def _from_url(url: str, *, offline: bool) -> Index:
    target = url if url.endswith(".json") else url.rstrip("/") + "/" + INDEX_NAME
    cache = (
        llmir_home() / "registries" / (hashlib.sha256(target.encode()).hexdigest()[:16] + ".json")
    )
    if offline:
        if not cache.is_file():
            raise InputError(
                f"--offline: no cached copy of the registry {target}",
                hint="run once online to cache it, or use a registry folder",
            )
        return _from_file(cache, origin=url, kind="url", label=target)
    import urllib.error  # only URL registries need it
    import urllib.request

    try:
        with urllib.request.urlopen(target, timeout=30) as response:
            text = response.read().decode("utf-8")
    except (urllib.error.URLError, OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise InputError(
            f"cannot fetch the registry {target}: {reason}",
            hint="check the URL and the network, or rerun with --offline to use "
            "the copy cached by the last successful fetch",
        ) from exc
    index = _parse(text, label=target, origin=url, kind="url", path=cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(cache, text)
    return index


def _from_file(
    path: Path, *, origin: str, kind: str, mirror: Path | None = None, label: str | None = None
) -> Index:
    try:
        text = read_text(path)  # a byte that is not UTF-8: an error at file:line:col
    except InputError as exc:
        raise InputError(
            f"cannot read the registry index: {exc.message}",
            hint=exc.hint or "check the path and its permissions",
        ) from None
    return _parse(
        text, label=label or str(path), origin=origin, kind=kind, path=path, mirror=mirror
    )


def _parse(
    text: str, *, label: str, origin: str, kind: str, path: Path, mirror: Path | None = None
) -> Index:
    lines = text.splitlines()
    try:
        doc = jsonpos.parse(text)
    except jsonpos.JsonSyntaxError as exc:
        raise _index_error(
            label, lines, [(exc.line, exc.col, f"not valid JSON: {exc.message}")]
        ) from None
    problems = [(*doc.where(p), f"duplicate key {path_text(p)}") for p in doc.duplicates]
    errors = validate(doc.value, schema())
    if not errors:
        errors = _semantic_errors(doc.value)
    problems += [(*doc.where(e.path), f"{path_text(e.path)}: {e.message}") for e in errors]
    if problems:
        raise _index_error(label, lines, problems)
    entries = {name: _entry(name, raw) for name, raw in doc.value["models"].items()}
    return Index(origin=origin, kind=kind, path=path, entries=entries, mirror=mirror)


def _semantic_errors(value: dict[str, Any]) -> list[SchemaError]:
    """Rules a schema cannot say: unique paths, one weight file per format."""
    errors: list[SchemaError] = []
    for name, model in value["models"].items():
        paths = [f["path"] for f in model["files"]]
        for i, p in enumerate(paths):
            if p in paths[:i]:
                errors.append(
                    SchemaError(("models", name, "files", i, "path"), f"{p!r} listed twice")
                )
        suffix = "." + model["format"]
        weights = [p for p in paths if p.endswith(suffix)]
        if model["format"] == "gguf" and len(weights) != 1:
            errors.append(
                SchemaError(
                    ("models", name, "files"),
                    f"a gguf model lists exactly one .gguf file, found {len(weights)}",
                )
            )
        if (
            model["format"] == "safetensors"
            and not weights
            and not any("safetensors" in pat for pat in model.get("include", []))
        ):
            errors.append(
                SchemaError(
                    ("models", name, "files"),
                    "a safetensors model needs a .safetensors file or pattern",
                )
            )
    return errors


def _index_error(label: str, lines: list[str], problems: list[tuple[int, int, str]]) -> InputError:
    diags = [
        Diagnostic(
            "error",
            message,
            SourcePos(label, line, col),
            source_line=lines[line - 1] if 0 < line <= len(lines) else None,
        )
        for line, col, message in problems[:MAX_DIAGNOSTICS]
    ]
    if len(problems) > MAX_DIAGNOSTICS:
        diags[-1].notes.append(f"{len(problems) - MAX_DIAGNOSTICS} more problem(s) not shown")
    first = diags[0]
    return InputError(
        f"{first.pos}: invalid registry index: {first.message}",
        diagnostics=diags,
        hint=f"fix the index at the line shown; its format is {SCHEMA_NAME} "
        "(shipped in llmir's registry/ folder)",
    )


def _entry(name: str, raw: dict[str, Any]) -> Entry:
    return Entry(
        name=name,
        description=raw["description"],
        repo=raw["source"]["hf"],
        revision=raw["source"]["revision"],
        format=raw["format"],
        quantization=raw["quantization"],
        license=raw["license"],
        parameters=raw["parameters"],
        files=tuple(FileSpec(f["path"], f["sha256"], f["size"]) for f in raw["files"]),
        include=tuple(raw.get("include", [])),
        notes=raw.get("notes"),
    )


def render_index(entries: list[Entry], description: str | None = None) -> str:
    """An index document (for mirrors), in the shipped index's layout."""
    models: dict[str, Any] = {}
    for e in entries:
        item = e.to_json()
        models[e.name] = {
            k: item[k]
            for k in (
                "description",
                "source",
                "format",
                "quantization",
                "license",
                "parameters",
                "files",
            )
        }
        if e.include:
            models[e.name]["include"] = list(e.include)
        if e.notes:
            models[e.name]["notes"] = e.notes
    doc: dict[str, Any] = {"index_version": 1}
    if description:
        doc["description"] = description
    doc["models"] = models
    return json.dumps(doc, indent=2) + "\n"
