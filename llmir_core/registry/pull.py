"""Resolve a model reference to verified local files.

`pull` turns `name:tag`, `hf:ORG/REPO[/FILE][@REV]` or a PATH into files on disk whose sha256
and size were checked against the lock, else the index, else the hub's LFS digest. A file that
fails the check is removed from the cache and the pull fails. A digest known to none of them
is computed here and pinned in the returned lock ("pinned on first pull").

Offline, nothing touches the network: files come from the hub cache (by the locked commit or
the commit the cache last saw) or from a directory mirror's `blobs/`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmir_core.errors import CheckFailed, Diagnostic, InputError
from llmir_core.fileio import sha256_file

from .home import HubSettings, hub_settings, llmir_home
from .index import Entry, Index, load_index
from .lockfile import LOCK_FILE, Lock, LockedFile, read_lock
from .refs import COMMIT_RE, HfRef, PathRef, RegistryRef, parse_ref
from .sinks import ProgressSink, Quiet, Reporter

if TYPE_CHECKING:
    from .hub import RemoteFile

# What `hf:ORG/REPO` fetches when no file is named: weights, configs and tokenizer files.
HF_DEFAULT_PATTERNS = ("*.safetensors", "*.json", "tokenizer.model", "merges.txt", "vocab.txt")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PulledFile:
    path: str
    local: Path
    size: int
    sha256: str
    pinned_by: str  # "lock" | "index" | "hub" | "first pull"
    source: str  # "cache" | "hub" | "mirror" | "local"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "local": str(self.local),
            "size": self.size,
            "sha256": self.sha256,
            "pinned_by": self.pinned_by,
            "source": self.source,
        }


@dataclass
class PullResult:
    """What `pull` produced: the files, their lock, and the path an importer should read."""

    ref: str
    kind: str
    lock: Lock
    root: Path  # the folder holding the files
    local_path: Path  # the single weight file for one-file models, else `root`
    files: list[PulledFile] = field(default_factory=list)
    entry: Entry | None = None
    index: str | None = None  # which index resolved a name

    @property
    def downloaded(self) -> int:
        return sum(f.size for f in self.files if f.source == "hub")

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "kind": self.kind,
            "index": self.index,
            "local_path": str(self.local_path),
            "root": str(self.root),
            "lock": self.lock.to_json(),
            "files": [f.to_json() for f in self.files],
            "entry": self.entry.to_json() if self.entry else None,
        }


@dataclass(frozen=True)
class _Want:
    path: str
    sha256: str | None
    size: int | None
    pinned_by: str | None


def human_size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def same_ref(a: str, b: str) -> bool:
    """Whether two references name the same model (`smollm2` == `smollm2:latest`)."""
    try:
        return str(parse_ref(a)) == str(parse_ref(b))
    except InputError:
        return a == b


def resolve_model_ref(
    ref: str, *, registry: str | None, offline: bool, project: Path | None = None
) -> Path:
    """The local model folder or file for `ref`, pulled and verified.

    When `project` (default: the current folder) holds an llmir.lock for the same reference,
    exactly the locked files are used, so `llmir import` in a project reproduces `llmir init`.
    """
    lock_path = (project or Path.cwd()) / LOCK_FILE
    lock = None
    if lock_path.is_file():
        candidate = read_lock(lock_path)
        if same_ref(candidate.ref, ref):
            lock = candidate
    return pull(ref, registry=registry, offline=offline, lock=lock).local_path


def pull(
    ref: str,
    *,
    registry: str | None = None,
    offline: bool = False,
    lock: Lock | None = None,
    progress: ProgressSink | None = None,
    reporter: Reporter | None = None,
) -> PullResult:
    """Resolve `ref` (reproducing `lock` exactly when given) to verified local files."""
    rep = reporter or Quiet()
    settings = hub_settings()
    offline = offline or settings.offline
    parsed = parse_ref(ref)
    if lock is not None and not same_ref(lock.ref, ref):
        raise InputError(
            f"llmir.lock pins {lock.ref}, not {parsed}",
            hint="pass the locked model, or `llmir init --force` to re-pin the project",
        )
    if isinstance(parsed, PathRef):
        return _pull_path(parsed, lock, rep)
    if isinstance(parsed, HfRef):
        return _Puller(settings, offline, progress, rep).hf(parsed, lock)
    return _pull_registry(parsed, registry, offline, lock, settings, progress, rep)


def _pull_registry(
    ref: RegistryRef,
    registry: str | None,
    offline: bool,
    lock: Lock | None,
    settings: HubSettings,
    progress: ProgressSink | None,
    rep: Reporter,
) -> PullResult:
    index = load_index(registry, offline=offline)
    rep.detail(f"resolving {ref} in the {index.describe()}")
    if lock is not None and ref.name not in index.entries:
        rep.log(f"warning: the {index.describe()} has no {ref}; using llmir.lock alone")
        entry = None
    else:
        entry = index.get(ref.name)
    if lock is not None and entry is not None:
        check_lock_matches_entry(lock, entry, index)
    puller = _Puller(settings, offline, progress, rep)
    result = puller.registry(ref, entry, index, lock)
    result.index = index.describe()
    return result


def check_lock_matches_entry(lock: Lock, entry: Entry, index: Index) -> None:
    """A lock and the index must agree on everything the index pins."""
    problems: list[str] = []
    if lock.repo != entry.repo:
        problems.append(f"repository: lock {lock.repo}, index {entry.repo}")
    if COMMIT_RE.fullmatch(entry.revision) and lock.commit != entry.revision:
        problems.append(f"commit: lock {lock.commit}, index {entry.revision}")
    for spec in entry.files:
        locked = lock.file(spec.path)
        if locked is None:
            problems.append(f"{spec.path}: in the index, not in the lock")
        elif spec.sha256 and locked.sha256 != spec.sha256:
            problems.append(
                f"{spec.path}: sha256 lock {locked.sha256[:12]}…, index {spec.sha256[:12]}…"
            )
        elif spec.size is not None and locked.size != spec.size:
            problems.append(f"{spec.path}: size lock {locked.size}, index {spec.size}")
    if not problems:
        return
    diag = Diagnostic(
        "error",
        f"llmir.lock disagrees with the {index.describe()} about {entry.name}: {problems[0]}",
        notes=problems[1:],
    )
    raise InputError(
        diag.message,
        diagnostics=[diag],
        hint="if the index changed on purpose, `llmir init --force` re-pins the "
        "project; otherwise point --registry / LLMIR_REGISTRY at the index "
        "that wrote the lock",
    )


def _pull_path(ref: PathRef, lock: Lock | None, rep: Reporter) -> PullResult:
    root = ref.path if ref.path.is_dir() else ref.path.parent
    if ref.path.is_dir():
        names = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
    else:
        names = [ref.path.name]
    if not names:
        raise InputError(f"{ref.path} holds no files", hint="point at a model file or folder")
    files = []
    for name in names:
        local = root / name
        files.append(
            PulledFile(
                name,
                local,
                local.stat().st_size,
                sha256_file(local),
                "lock" if lock else "first pull",
                "local",
            )
        )
    if lock is not None:
        by_path = {f.path: f for f in files}
        for locked in lock.files:
            got = by_path.get(locked.path)
            if got is None:
                raise CheckFailed(
                    f"{root / locked.path} is gone since llmir.lock was written",
                    hint="restore the file, or `llmir init --force` to re-pin",
                )
            if got.sha256 != locked.sha256 or got.size != locked.size:
                raise CheckFailed(
                    f"{got.local} changed since llmir.lock was written "
                    f"(sha256 {got.sha256[:12]}…, locked {locked.sha256[:12]}…)",
                    hint="restore the locked file, or `llmir init --force` to re-pin",
                )
        extra = sorted(set(by_path) - {f.path for f in lock.files})
        if extra:
            rep.log(f"note: {len(extra)} file(s) not in llmir.lock ignored: {', '.join(extra[:3])}")
        files = [by_path[f.path] for f in lock.files]
    new_lock = Lock(
        ref=str(ref.path),
        kind="path",
        path=str(ref.path),
        format=_format_of(names),
        files=tuple(LockedFile(f.path, f.size, f.sha256) for f in files),
    )
    return PullResult(
        ref=str(ref.path), kind="path", lock=new_lock, root=root, local_path=ref.path, files=files
    )


def _format_of(paths: list[str]) -> str | None:
    for suffix, name in ((".gguf", "gguf"), (".safetensors", "safetensors"), (".onnx", "onnx")):
        if any(p.endswith(suffix) for p in paths):
            return name
    return None


def _match(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Glob match; a pattern without '/' matches top-level files only."""
    return any(
        fnmatch.fnmatchcase(path, pat) and ("/" in pat or "/" not in path) for pat in patterns
    )


class _Puller:
    """One pull from the hub (or its cache, or a mirror), with shared settings."""

    def __init__(
        self, settings: HubSettings, offline: bool, progress: ProgressSink | None, rep: Reporter
    ) -> None:
        self.s, self.offline, self.progress, self.rep = settings, offline, progress, rep
        self._hub: Any = None

    @property
    def hub(self) -> Any:
        if self._hub is None:  # huggingface_hub is slow to import: only when needed
            from . import hub

            self._hub = hub
        return self._hub

    # -- entry points -------------------------------------------------------------------

    def registry(
        self, ref: RegistryRef, entry: Entry | None, index: Index, lock: Lock | None
    ) -> PullResult:
        if lock is not None:
            wants = [_Want(f.path, f.sha256, f.size, "lock") for f in lock.files]
            repo = lock.repo or (entry.repo if entry else "")
            revision, commit = lock.revision or "", lock.commit
            patterns: tuple[str, ...] = ()
        else:
            assert entry is not None
            wants = [
                _Want(f.path, f.sha256, f.size, "index" if f.sha256 else None) for f in entry.files
            ]
            repo, revision, commit = entry.repo, entry.revision, None
            patterns = entry.include
        fmt = entry.format if entry else (lock.format if lock else None)
        mirrored = self._from_mirror(ref, index, wants, patterns)
        if mirrored is not None:
            files, root = mirrored
            commit = commit or (revision if COMMIT_RE.fullmatch(revision) else None)
        else:
            files, root, commit = self._from_hub(repo, revision, commit, wants, patterns)
        return self._result(
            str(ref), "registry", repo, revision, commit, fmt, files, root, entry=entry
        )

    def hf(self, ref: HfRef, lock: Lock | None) -> PullResult:
        if lock is not None:
            wants = [_Want(f.path, f.sha256, f.size, "lock") for f in lock.files]
            files, root, commit = self._from_hub(ref.repo, ref.revision, lock.commit, wants, ())
        elif ref.file:
            files, root, commit = self._from_hub(
                ref.repo, ref.revision, None, [_Want(ref.file, None, None, None)], ()
            )
        else:
            files, root, commit = self._from_hub(
                ref.repo, ref.revision, None, [], HF_DEFAULT_PATTERNS, pick_gguf=True
            )
        return self._result(
            str(ref),
            "hf",
            ref.repo,
            ref.revision,
            commit,
            _format_of([f.path for f in files]),
            files,
            root,
        )

    def _result(
        self,
        ref: str,
        kind: str,
        repo: str,
        revision: str,
        commit: str | None,
        fmt: str | None,
        files: list[PulledFile],
        root: Path,
        entry: Entry | None = None,
    ) -> PullResult:
        files = sorted(files, key=lambda f: f.path)
        lock = Lock(
            ref=ref,
            kind=kind,
            repo=repo,
            revision=revision or None,
            commit=commit,
            format=fmt or _format_of([f.path for f in files]),
            files=tuple(LockedFile(f.path, f.size, f.sha256) for f in files),
        )
        weights = [f for f in files if f.path.endswith(".gguf")]
        local = weights[0].local if len(weights) == 1 and (lock.format == "gguf") else root
        return PullResult(
            ref=ref, kind=kind, lock=lock, root=root, local_path=local, files=files, entry=entry
        )

    # -- the hub and its cache ----------------------------------------------------------

    def _from_hub(
        self,
        repo: str,
        revision: str,
        commit: str | None,
        wants: list[_Want],
        patterns: tuple[str, ...],
        pick_gguf: bool = False,
    ) -> tuple[list[PulledFile], Path, str]:
        if self.offline:
            return self._from_cache(repo, revision, commit, wants, patterns, pick_gguf)
        if commit is None:
            if COMMIT_RE.fullmatch(revision):
                commit = revision
            else:
                commit = self.hub.resolve_commit(self.s, repo, revision)
                self.hub.remember_ref(self.s, repo, revision, commit)
                self.rep.detail(f"{repo}@{revision} is commit {commit}")
        remote: dict[str, RemoteFile] = {}
        if patterns or any(w.pinned_by != "lock" for w in wants):
            remote = self.hub.list_files(self.s, repo, commit)
            wants = self._expand(repo, commit, wants, patterns, list(remote), pick_gguf)
            wants = [self._with_hub_digest(repo, commit, w, remote.get(w.path)) for w in wants]
        files = [self._fetch(repo, commit, w) for w in wants]
        return files, self._root(files), commit

    def _from_cache(
        self,
        repo: str,
        revision: str,
        commit: str | None,
        wants: list[_Want],
        patterns: tuple[str, ...],
        pick_gguf: bool,
    ) -> tuple[list[PulledFile], Path, str]:
        if commit is None:
            commit = (
                revision
                if COMMIT_RE.fullmatch(revision)
                else self.hub.cached_commit(self.s, repo, revision)
            )
        if commit is None:
            raise InputError(
                f"--offline: {repo}@{revision} is not in the hub cache ({self.s.cache_dir})",
                hint="pull it once online (same HF_HOME), or use a directory "
                "registry made by `llmir registry mirror`",
            )
        cached = self.hub.cached_paths(self.s, repo, commit)
        wants = self._expand(repo, commit, wants, patterns, cached, pick_gguf)
        missing = [w.path for w in wants if self.hub.cached(self.s, repo, w.path, commit) is None]
        if missing:
            raise InputError(
                f"--offline: {len(missing)} file(s) of {repo}@{commit[:12]} are not "
                f"cached: {', '.join(missing[:4])}",
                hint="pull once online with the same HF_HOME, or use a directory "
                "registry made by `llmir registry mirror`",
            )
        files = [self._fetch(repo, commit, w) for w in wants]
        return files, self._root(files), commit

    def _expand(
        self,
        repo: str,
        commit: str,
        wants: list[_Want],
        patterns: tuple[str, ...],
        available: list[str],
        pick_gguf: bool,
    ) -> list[_Want]:
        have = set(available)
        named = {w.path for w in wants}
        if not self.offline:
            absent = [p for p in named if p not in have]
            if absent:
                raise InputError(
                    f"{repo}@{commit[:12]} has no file {absent[0]}",
                    hint="the index names a file the repository lacks: fix the "
                    "index, or pick another revision",
                )
        extra = [p for p in sorted(have) if p not in named and _match(p, patterns)]
        if pick_gguf and not any(p.endswith(".safetensors") for p in extra):
            ggufs = sorted(p for p in have if p.endswith(".gguf"))
            if len(ggufs) > 1:
                raise InputError(
                    f"{repo} holds {len(ggufs)} GGUF files; name one",
                    hint=f"write hf:{repo}/{ggufs[0]} (or another of: {', '.join(ggufs[1:4])})",
                )
            extra = ggufs + [p for p in extra if p.endswith(".json")]
        wants = wants + [_Want(p, None, None, None) for p in extra]
        if not wants:
            raise InputError(
                f"{repo}@{commit[:12]}: no model files found",
                hint=f"name a file: hf:{repo}/FILE, or check the repository",
            )
        return wants

    def _with_hub_digest(
        self, repo: str, commit: str, want: _Want, remote: RemoteFile | None
    ) -> _Want:
        if remote is None:
            return want
        if want.sha256 and remote.sha256 and want.sha256 != remote.sha256:
            raise CheckFailed(
                f"{repo}@{commit[:12]} {want.path}: the hub's file has sha256 "
                f"{remote.sha256[:12]}…, the {want.pinned_by} expects {want.sha256[:12]}…",
                hint="the file changed on the hub; if that is expected, update the index "
                "(or `llmir init --force` to re-pin), otherwise do not use this source",
            )
        if want.sha256:
            return (
                want
                if want.size is not None
                else _Want(want.path, want.sha256, remote.size, want.pinned_by)
            )
        return _Want(
            want.path,
            remote.sha256,
            want.size if want.size is not None else remote.size,
            "hub" if remote.sha256 else None,
        )

    def _fetch(self, repo: str, commit: str, want: _Want) -> PulledFile:
        local = self.hub.cached(self.s, repo, want.path, commit)
        if local is not None:
            checked, _ = self._check(want, local, "cache")
            if checked is not None:
                return checked
            self.rep.log(f"warning: cached {want.path} is corrupt; removed it")
            self.hub.discard(self.s, local)
            if self.offline:
                raise CheckFailed(
                    f"--offline: the cached {want.path} of {repo} failed its "
                    "sha256 check and was removed",
                    hint="rerun online to download it again",
                )
        self.rep.log(f"downloading {repo}/{want.path} ({human_size(want.size)})")
        local = self.hub.download(self.s, repo, want.path, commit, self.progress)
        checked, (size, digest) = self._check(want, local, "hub")
        if checked is None:
            self.hub.discard(self.s, local)
            expected = (
                f"sha256 {want.sha256[:12]}…"
                if want.sha256 and digest != want.sha256
                else f"size {want.size}"
            )
            got = f"sha256 {digest[:12]}…" if expected.startswith("sha") else f"size {size}"
            raise CheckFailed(
                f"{repo}@{commit[:12]} {want.path}: got {got}, expected {expected} "
                f"(pinned by the {want.pinned_by or 'hub'}); the file was removed and not used",
                hint="the file changed on the hub or in transit; if the change is expected, "
                "update the index (or `llmir init --force` to re-pin), else report it",
            )
        return checked

    def _check(
        self, want: _Want, local: Path, source: str
    ) -> tuple[PulledFile | None, tuple[int, str]]:
        size = local.stat().st_size
        digest = sha256_file(local)
        if (want.sha256 and digest != want.sha256) or (want.size is not None and size != want.size):
            return None, (size, digest)
        pinned = want.pinned_by or "first pull"
        if want.sha256:
            self.rep.detail(f"verified {want.path} sha256:{digest[:12]}… ({want.pinned_by})")
        else:
            self.rep.log(
                f"{want.path} is not pinned by the index: pinned on first pull as "
                f"sha256:{digest[:12]}…"
            )
        return PulledFile(want.path, local, size, digest, pinned, source), (size, digest)

    @staticmethod
    def _root(files: list[PulledFile]) -> Path:
        first = files[0]
        return first.local.parents[len(Path(first.path).parts) - 1]

    # -- directory mirrors --------------------------------------------------------------

    def _from_mirror(
        self, ref: RegistryRef, index: Index, wants: list[_Want], patterns: tuple[str, ...]
    ) -> tuple[list[PulledFile], Path] | None:
        if index.mirror is None:
            return None
        blobs = {w.path: index.blob(w.sha256) if w.sha256 else None for w in wants}
        missing = [p for p, b in blobs.items() if b is None]
        if not missing and not patterns:
            return self._materialize(ref, wants, blobs)
        why = (
            f"its entry for {ref} has patterns, not a pinned file list"
            if patterns
            else f"it lacks {', '.join(missing[:3])}"
        )
        if self.offline:
            raise InputError(
                f"--offline: the mirror {index.origin} cannot serve {ref}: {why}",
                hint="rebuild it with `llmir registry mirror DIR NAME:TAG`, or rerun online",
            )
        self.rep.log(f"note: the mirror cannot serve {ref} ({why}); using the hub")
        return None

    def _materialize(
        self, ref: RegistryRef, wants: list[_Want], blobs: dict[str, Path | None]
    ) -> tuple[list[PulledFile], Path]:
        key = hashlib.sha256(
            "".join(f"{w.path}\0{w.sha256}\n" for w in sorted(wants, key=lambda w: w.path)).encode()
        ).hexdigest()[:16]
        root = llmir_home() / "models" / ref.name.replace(":", "-") / key
        files = []
        for w in wants:
            blob, target = blobs[w.path], root / w.path
            assert blob is not None and w.sha256
            if not (target.is_file() and sha256_file(target) == w.sha256):
                digest = sha256_file(blob)
                if digest != w.sha256 or (w.size is not None and blob.stat().st_size != w.size):
                    raise CheckFailed(
                        f"mirror blob {blob} does not match its sha256 ({digest[:12]}…); not used",
                        hint="the mirror is damaged: rebuild it with `llmir registry mirror`",
                    )
                link_or_copy(blob, target)
            self.rep.detail(f"verified {w.path} sha256:{w.sha256[:12]}… (mirror)")
            files.append(
                PulledFile(
                    w.path,
                    target,
                    target.stat().st_size,
                    w.sha256,
                    w.pinned_by or "index",
                    "mirror",
                )
            )
        return files, root


def link_or_copy(src: Path, target: Path) -> None:
    """Place `src` at `target` atomically: a hard link when possible, else a copy."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise InputError(
            f"cannot write in {target.parent}: {exc.strerror}",
            hint="check LLMIR_HOME's permissions and free space",
        ) from exc
    real = os.path.realpath(src)  # hub cache entries are symlinks: link their blob
    try:
        try:
            os.link(real, tmp)
        except OSError:
            shutil.copyfile(real, tmp)
        os.replace(tmp, target)
    except BaseException as exc:  # an OSError, or Ctrl-C during a long copy: no temp file stays
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(exc, OSError):
            raise
        raise InputError(
            f"cannot write {target}: {exc.strerror}",
            hint="check LLMIR_HOME's permissions and free space",
        ) from exc
