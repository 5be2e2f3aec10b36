"""`llmir registry mirror`: copy models into a folder usable as an air-gapped registry.

The folder holds `index.json` (entries pinned to the pulled commit and every file's sha256 and
size) and `blobs/<sha256>`. Copy it anywhere; `--registry FOLDER --offline` then pulls from it
with no network. Writing into an existing mirror adds or replaces entries and keeps the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmir_core.errors import InputError
from llmir_core.fileio import write_text_atomic

from .index import INDEX_NAME, Entry, FileSpec, load_index, render_index
from .pull import PullResult, link_or_copy, pull, sha256_file
from .refs import RegistryRef, parse_ref
from .sinks import ProgressSink, Reporter


@dataclass
class MirrorResult:
    directory: Path
    added: list[str] = field(default_factory=list)
    blobs_written: int = 0
    bytes_written: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "added": self.added,
            "blobs_written": self.blobs_written,
            "bytes_written": self.bytes_written,
        }


def write_mirror(
    directory: Path,
    refs: list[str],
    *,
    registry: str | None = None,
    offline: bool = False,
    progress: ProgressSink | None = None,
    reporter: Reporter | None = None,
) -> MirrorResult:
    """Pull each `name:tag` and add it, pinned, to the mirror in `directory`."""
    names = []
    for ref in refs:
        parsed = parse_ref(ref)
        if not isinstance(parsed, RegistryRef):
            raise InputError(
                f"{ref}: a mirror holds index models (NAME:TAG) only",
                hint="add the model to an index file first, then mirror it by name",
            )
        names.append(parsed.name)
    index_file = directory / INDEX_NAME
    entries: dict[str, Entry] = {}
    if index_file.is_file():
        entries = dict(load_index(str(directory), offline=True).entries)
    result = MirrorResult(directory=directory)
    blobs = directory / "blobs"
    for name in names:
        pulled = pull(
            name, registry=registry, offline=offline, progress=progress, reporter=reporter
        )
        entries[name] = _pinned_entry(pulled)
        for f in pulled.files:
            target = blobs / f.sha256
            if (
                target.is_file()
                and target.stat().st_size == f.size
                and sha256_file(target) == f.sha256
            ):
                continue
            link_or_copy(f.local, target)
            result.blobs_written += 1
            result.bytes_written += f.size
        result.added.append(name)
    directory.mkdir(parents=True, exist_ok=True)
    text = render_index(
        sorted(entries.values(), key=lambda e: e.name),
        description="An llmir registry mirror: files are in blobs/<sha256>.",
    )
    write_text_atomic(index_file, text)
    return result


def _pinned_entry(pulled: PullResult) -> Entry:
    assert pulled.entry is not None
    files = tuple(FileSpec(f.path, f.sha256, f.size) for f in pulled.files)
    return replace(
        pulled.entry, revision=pulled.lock.commit or pulled.entry.revision, files=files, include=()
    )
