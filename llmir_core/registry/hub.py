"""Everything that talks to the Hugging Face hub, through huggingface_hub's public API.

This is the only module that imports huggingface_hub (slow to import, so callers import this
module only when they need the hub). Endpoint, cache folder and token are read from the
environment at call time and passed explicitly. Downloads land in the hub's normal cache
(HF_HOME / HF_HUB_CACHE); huggingface_hub resumes a transfer that drops mid-file with an HTTP
Range request. Nothing here runs when llmir is offline except the cache lookups, which read the
disk only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import huggingface_hub
from huggingface_hub import errors as hf_errors

from llmir_core.errors import CheckFailed, InputError
from llmir_core.fileio import write_text_atomic

from .home import HubSettings
from .sinks import ProgressSink


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # the LFS digest the hub declares; None for small (git) files


# huggingface_hub logs every retry as a warning line; llmir owns the terminal and reports the
# outcome itself (one error line and a hint).
logging.getLogger("huggingface_hub").setLevel(logging.ERROR)

PROBE_TIMEOUT_S = 5.0
_reachable: dict[str, None] = {}  # (host, port) probed once per process


def probe_target(endpoint: str) -> tuple[str, int, str]:
    """(host, port, description) of the first hop to `endpoint`: its proxy when the proxy
    variables (HTTPS_PROXY, ALL_PROXY, ... minus NO_PROXY) route it through one, else the hub."""
    url = urllib.parse.urlsplit(endpoint)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return (
            p.hostname or "",
            p.port or (443 if p.scheme == "https" else 80),
            f"the proxy {proxy}",
        )
    return host, port, f"the hub at {endpoint}"


def _check_reachable(s: HubSettings, what: str) -> None:
    """Fail in seconds, not after huggingface_hub's retries (about 30 s), when the hub (or the
    proxy in front of it) refuses or does not answer a TCP connection."""
    host, port, desc = probe_target(s.endpoint)
    key = f"{host}:{port}"
    if key in _reachable:
        return
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise InputError(
            f"cannot reach {desc} for {what}: {reason}",
            hint="check the network, HF_ENDPOINT and proxy settings; or rerun with "
            "--offline to use cached files or a directory registry",
        ) from None
    _reachable[key] = None


def _api(s: HubSettings) -> huggingface_hub.HfApi:
    return huggingface_hub.HfApi(endpoint=s.endpoint, token=s.token)


@contextlib.contextmanager
def _hub_errors(
    s: HubSettings, repo: str, revision: str, path: str | None = None
) -> Iterator[None]:
    """Turn huggingface_hub and transport errors into one clear line with a next step."""
    what = f"{repo}@{revision}" + (f" file {path}" if path else "")
    _check_reachable(s, what)
    try:
        yield
    except hf_errors.GatedRepoError as exc:
        raise InputError(
            f"{repo} is gated on the hub: {what} needs approved access",
            hint="accept the model's terms on its hub page, then set HF_TOKEN",
        ) from exc
    except hf_errors.RepositoryNotFoundError as exc:
        raise InputError(
            f"no repository {repo} at {s.endpoint}",
            hint="check the repository name; for a private one set HF_TOKEN",
        ) from exc
    except hf_errors.RevisionNotFoundError as exc:
        raise InputError(
            f"{repo} has no revision {revision!r}",
            hint="use a branch, tag or commit that exists in the repository",
        ) from exc
    except hf_errors.RemoteEntryNotFoundError as exc:
        raise InputError(
            f"{repo}@{revision} has no file {path}",
            hint="the index entry names a file the repository lacks: fix the index, "
            "or pick another revision",
        ) from exc
    except hf_errors.HfHubHTTPError as exc:
        raise InputError(
            f"the hub refused {what}: {_reason(exc)}",
            hint="check HF_TOKEN and the repository's access settings, then retry",
        ) from exc
    except (httpx2.HTTPError, hf_errors.LocalEntryNotFoundError, ConnectionError) as exc:
        raise InputError(
            f"cannot reach the hub at {s.endpoint} for {what}: {_reason(exc)}",
            hint="check the network, HF_ENDPOINT and proxy settings; or rerun with "
            "--offline to use cached files or a directory registry",
        ) from exc
    except OSError as exc:
        if "Consistency check failed" in str(exc):
            raise CheckFailed(
                f"{what}: the download's size does not match the hub's: {_reason(exc)}",
                hint="retry; if it persists the hub or a proxy serves a bad file",
            ) from exc
        raise InputError(
            f"cannot store {what} in the hub cache: {exc}",
            hint="check free space and permissions of HF_HOME / HF_HUB_CACHE",
        ) from exc


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def resolve_commit(s: HubSettings, repo: str, revision: str) -> str:
    """The commit a branch or tag points at now (one API call)."""
    with _hub_errors(s, repo, revision):
        info = _api(s).model_info(repo, revision=revision)
    if not info.sha:
        raise InputError(
            f"the hub gave no commit for {repo}@{revision}",
            hint="check that HF_ENDPOINT points at a Hugging Face hub",
        )
    return str(info.sha)


def list_files(s: HubSettings, repo: str, commit: str) -> dict[str, RemoteFile]:
    """Every file of the repository at `commit`, with size and LFS digest."""
    out: dict[str, RemoteFile] = {}
    with _hub_errors(s, repo, commit):
        for item in _api(s).list_repo_tree(repo, revision=commit, recursive=True):
            if isinstance(item, huggingface_hub.hf_api.RepoFile):
                out[item.path] = RemoteFile(
                    item.path, int(item.size), item.lfs.sha256 if item.lfs else None
                )
    return out


def download(
    s: HubSettings, repo: str, path: str, commit: str, progress: ProgressSink | None = None
) -> Path:
    """Fetch one file into the hub cache (a no-op when it is cached) and return its path."""
    with _hub_errors(s, repo, commit, path):
        local = huggingface_hub.hf_hub_download(
            repo,
            path,
            revision=commit,
            cache_dir=s.cache_dir,
            endpoint=s.endpoint,
            token=s.token,
            tqdm_class=_bar_class(progress, path),
        )
    return Path(local)


def cached(s: HubSettings, repo: str, path: str, commit: str) -> Path | None:
    """The cached copy of `path` at `commit`, reading only the disk."""
    found = huggingface_hub.try_to_load_from_cache(
        repo, path, cache_dir=s.cache_dir, revision=commit
    )
    return Path(found) if isinstance(found, str) else None


def _repo_folder(s: HubSettings, repo: str) -> Path:
    return s.cache_dir / ("models--" + repo.replace("/", "--"))


def cached_commit(s: HubSettings, repo: str, revision: str) -> str | None:
    """The commit the cache last saw `revision` point at (disk only)."""
    ref = _repo_folder(s, repo) / "refs" / revision
    try:
        text = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def remember_ref(s: HubSettings, repo: str, revision: str, commit: str) -> None:
    """Record in the cache which commit `revision` resolved to, as huggingface_hub's own
    snapshot_download does, so a later offline run can find it."""
    ref = _repo_folder(s, repo) / "refs" / revision
    if cached_commit(s, repo, revision) == commit:
        return
    with contextlib.suppress(OSError, InputError):  # only a convenience for offline runs
        ref.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(ref, commit)


def cached_paths(s: HubSettings, repo: str, commit: str) -> list[str]:
    """Relative paths of the files cached for `commit` (disk only)."""
    root = _repo_folder(s, repo) / "snapshots" / commit
    if not root.is_dir():
        return []
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()
    )


def discard(s: HubSettings, pointer: Path) -> None:
    """Remove a bad file from the hub cache: the snapshot link and the blob behind it."""
    blob = Path(os.path.realpath(pointer))
    with contextlib.suppress(OSError):
        pointer.unlink()
    cache = Path(os.path.realpath(s.cache_dir))
    if cache in blob.parents:
        with contextlib.suppress(OSError):
            blob.unlink()


def _bar_class(progress: ProgressSink | None, name: str) -> type[Any] | None:
    """A tqdm stand-in that forwards huggingface_hub's byte counts to `progress`.

    huggingface_hub creates the bar with total/initial and calls update(n), also with a negative
    n when a server ignores a resume request; retries reuse the same bar.
    """
    if progress is None:
        return _SilentBar
    sink = progress

    class _Bar(_SilentBar):
        def __init__(
            self, *args: Any, total: int | None = None, initial: int = 0, **kwargs: Any
        ) -> None:
            sink.start(name, total, initial)

        def update(self, n: float | None = 1) -> None:
            sink.advance(name, int(n or 0))

        def close(self) -> None:
            sink.finish(name)

    return _Bar


class _SilentBar:
    """Draws nothing: llmir owns the terminal (and never draws into a pipe)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _SilentBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float | None = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        pass
