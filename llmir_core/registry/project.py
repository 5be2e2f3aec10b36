"""`llmir init`: create a project folder with llmir.toml and llmir.lock.

With an llmir.lock already in the folder, init reproduces exactly the locked files or fails,
and rewrites nothing. The model is pulled before anything is written, and both files are
staged as temporary files and renamed into place together, so a failure (a bad digest, a full
disk, an unwritable folder) leaves no half-written project behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmir_core.errors import InputError

from .index import registry_source
from .lockfile import (
    LOCK_FILE,
    PROJECT_FILE,
    ProjectConfig,
    read_lock,
    read_project,
    render_lock,
    render_project,
)
from .pull import PullResult, pull, same_ref
from .sinks import ProgressSink, Reporter

_PROJECT_FILES = {PROJECT_FILE, LOCK_FILE}


@dataclass
class InitResult:
    project: Path
    pulled: PullResult
    config: ProjectConfig
    reproduced: bool  # an existing llmir.lock was reproduced
    wrote: list[Path] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "project": str(self.project),
            "reproduced": self.reproduced,
            "wrote": [str(p) for p in self.wrote],
            "model": self.pulled.to_json(),
            "target": self.config.target,
            "opt_level": self.config.opt_level,
        }


def init_project(
    directory: Path,
    *,
    model: str | None,
    registry: str | None = None,
    offline: bool = False,
    force: bool = False,
    target: str | None = None,
    opt_level: int | None = None,
    progress: ProgressSink | None = None,
    reporter: Reporter | None = None,
) -> InitResult:
    """Create (or, with a lock present, reproduce) the project in `directory`."""
    if directory.exists() and not directory.is_dir():
        raise InputError(
            f"{directory} exists and is not a folder", hint="pick a folder path for the project"
        )
    lock_path, toml_path = directory / LOCK_FILE, directory / PROJECT_FILE
    lock = None if force or not lock_path.is_file() else read_lock(lock_path)
    existing = None if force or not toml_path.is_file() else read_project(toml_path)
    if lock is not None:
        if model and not same_ref(model, lock.ref):
            raise InputError(
                f"{lock_path} pins {lock.ref}, not {model}",
                hint=f"drop --model to reproduce {lock.ref}, or add --force to "
                f"re-pin the project to {model}",
            )
        model = lock.ref
    else:
        _refuse_non_empty(directory, force)
        model = model or (existing.model if existing else None)
    if not model:
        raise InputError(
            "no model given",
            hint="pass --model NAME:TAG (see `llmir registry list`), "
            "--model hf:ORG/REPO or --model PATH",
        )
    if target is not None:
        from llmir_core.targets import target_specs

        if target not in (known := target_specs()):
            raise InputError(
                f"unknown --target {target!r}", hint=f"known targets: {', '.join(known)}"
            )
    registry = registry_source(registry) or (existing.registry if existing else None)
    _check_writable(directory)
    pulled = pull(
        model, registry=registry, offline=offline, lock=lock, progress=progress, reporter=reporter
    )
    config = ProjectConfig(
        model=pulled.ref,
        registry=_relative_to(registry, directory),
        target=target or (existing.target if existing else ProjectConfig.target),
        opt_level=opt_level
        if opt_level is not None
        else (existing.opt_level if existing else ProjectConfig.opt_level),
    )
    contents = {} if existing and lock else {PROJECT_FILE: render_project(config)}
    if lock is None:
        contents[LOCK_FILE] = render_lock(pulled.lock)
    wrote = write_files(directory, contents)
    return InitResult(
        project=directory, pulled=pulled, config=config, reproduced=lock is not None, wrote=wrote
    )


def _relative_to(registry: str | None, directory: Path) -> str | None:
    """A local registry path as llmir.toml stores it: relative to the project folder (so the
    project works from its own folder, and moves together with a mirror beside it)."""
    if not registry or "://" in registry:
        return registry
    return os.path.relpath(Path(registry).expanduser().resolve(), directory.resolve())


def _refuse_non_empty(directory: Path, force: bool) -> None:
    if force or not directory.is_dir():
        return
    others = sorted(p.name for p in directory.iterdir() if p.name not in _PROJECT_FILES)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise InputError(
            f"{directory} is not empty ({shown})",
            hint="pick a new or empty folder, or add --force to initialise it "
            "anyway (replaces llmir.toml and llmir.lock, keeps other files)",
        )


def _check_writable(directory: Path) -> None:
    """Fail before a long download when the project could not be written anyway."""
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(
            f"cannot create {directory}: {probe} is not a folder",
            hint="pick a project path whose parent is a folder",
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(
            f"cannot write in {probe}: permission denied",
            hint="pick a folder you can write to, or fix its permissions",
        )


def write_files(directory: Path, contents: dict[str, str]) -> list[Path]:
    """Write every file or none: stage temporary files, then rename them all into place."""
    if not contents:
        return []
    created = [p for p in (directory, *directory.parents) if not p.exists()]
    existed = {name for name in contents if (directory / name).exists()}
    staged: dict[str, str] = {}
    placed: list[str] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in contents.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
            staged[name] = tmp
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for name, tmp in staged.items():
            os.replace(tmp, directory / name)
            placed.append(name)
    except BaseException as exc:  # an OSError, or Ctrl-C: nothing half-written stays
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for name in placed:
            if name not in existed:
                with contextlib.suppress(OSError):
                    os.unlink(directory / name)
        for folder in created:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not isinstance(exc, OSError):
            raise
        raise InputError(
            f"cannot write the project in {directory}: {exc.strerror or exc}",
            hint="check free disk space and the folder's permissions; nothing was written",
        ) from exc
    return [directory / name for name in contents]
