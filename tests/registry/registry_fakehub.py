"""A fake Hugging Face hub on 127.0.0.1 for the registry tests.

It serves what huggingface_hub calls: model info for a revision
(`/api/models/{repo}/revision/{rev}`), the recursive tree listing
(`/api/models/{repo}/tree/{commit}`), and file HEAD/GET on `/{repo}/resolve/{rev}/{path}` with
X-Repo-Commit, ETag, X-Linked-Etag and X-Linked-Size headers and HTTP Range. It counts TCP
connections (the offline tests expect none), logs every request, can cut a transfer once after
N bytes (the resume test), and can replace a file's bytes without a new commit (tampering).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_REVISION = re.compile(r"^/api/models/([^/]+/[^/]+)/revision/([^/]+)$")
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.connections = 0
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.cut_after: dict[str, int] = {}  # file path -> bytes sent before the first cut
        self.tampered: dict[tuple[str, str, str], bytes] = {}  # (repo, commit, path) -> bytes
        self.static: dict[str, bytes] = {}  # other URL paths served as plain files
        self.lock = threading.Lock()
        hub = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request, client_address):  # one call per TCP connection
                with hub.lock:
                    hub.connections += 1
                return True

        self.server = Server(("127.0.0.1", 0), _make_handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- repository content ---------------------------------------------------------------

    def publish(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        """Commit `files` as the new state of `branch`; return the commit id."""
        state = json.dumps({p: hashlib.sha256(b).hexdigest() for p, b in sorted(files.items())})
        commit = hashlib.sha1(f"{repo}\n{state}".encode()).hexdigest()
        entry = self.repos.setdefault(repo, Repo())
        entry.commits[commit] = dict(files)
        entry.refs[branch] = commit
        return commit

    def tamper(self, repo: str, commit: str, path: str, data: bytes) -> None:
        """Serve other bytes for a file without changing its commit or its declared digest."""
        self.tampered[(repo, commit, path)] = data

    def commit_of(self, repo: str, rev: str) -> str | None:
        entry = self.repos.get(repo)
        if entry is None:
            return None
        if rev in entry.commits:
            return rev
        return entry.refs.get(rev)

    def file_requests(self, path: str) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[1].endswith("/" + path) and "/resolve/" in r[1]]


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:  # noqa: C901 (a fake HTTP server, one branch per hub route)
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub.lock:
                hub.requests.append((self.command, path, self.headers.get("Range")))
            if path in hub.static:
                self._send(200, hub.static[path], {"Content-Type": "application/json"}, head)
                return
            for pattern, handler in (
                (_REVISION, self._revision),
                (_TREE, self._tree),
                (_RESOLVE, self._resolve),
            ):
                match = pattern.match(path)
                if match:
                    handler(head, *match.groups())
                    return
            self._error(404, "EntryNotFound", "no such route")

        def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, data: object, head: bool = False) -> None:
            self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"}, head)

        def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
            headers = {
                "X-Error-Code": code,
                "X-Error-Message": message,
                "Content-Type": "application/json",
            }
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(
                status, json.dumps({"error": message}).encode(), headers, self.command == "HEAD"
            )

        def _lookup(self, repo: str, rev: str) -> tuple[str, dict[str, bytes]] | None:
            if repo not in hub.repos:
                self._error(404, "RepoNotFound", f"Repository {repo} not found")
                return None
            commit = hub.commit_of(repo, rev)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return commit, hub.repos[repo].commits[commit]

        def _revision(self, head: bool, repo: str, rev: str) -> None:
            found = self._lookup(repo, rev)
            if found:
                commit, files = found
                self._json(
                    {
                        "id": repo,
                        "modelId": repo,
                        "sha": commit,
                        "private": False,
                        "siblings": [{"rfilename": p} for p in sorted(files)],
                    },
                    head,
                )

        def _tree(self, head: bool, repo: str, rev: str) -> None:
            found = self._lookup(repo, rev)
            if not found:
                return
            items = []
            for p, data in sorted(found[1].items()):
                item = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": p}
                if p.endswith(LFS_SUFFIXES):
                    item["lfs"] = {
                        "oid": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    }
                items.append(item)
            self._json(items, head)

        def _resolve(self, head: bool, repo: str, rev: str, path: str) -> None:
            found = self._lookup(repo, rev)
            if not found:
                return
            commit, files = found
            if path not in files:
                self._error(404, "EntryNotFound", f"{path} not found", commit)
                return
            declared = files[path]
            data = hub.tampered.get((repo, commit, path), declared)
            lfs = path.endswith(LFS_SUFFIXES)
            etag = hashlib.sha256(declared).hexdigest() if lfs else git_blob_sha1(declared)
            headers = {
                "X-Repo-Commit": commit,
                "ETag": f'"{etag}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if lfs:
                headers["X-Linked-Etag"] = f'"{etag}"'
                headers["X-Linked-Size"] = str(len(declared))
            if head:
                self._send(200, data, headers, head=True)
                return
            start = 0
            ranged = self.headers.get("Range")
            if ranged:
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", ranged)
                assert match, ranged
                start = int(match.group(1))
                end = int(match.group(2)) if match.group(2) else len(data) - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                body = data[start : end + 1]
                status = 206
            else:
                body, status = data, 200
            cut = hub.cut_after.pop(path, None) if not ranged else None
            if cut is None:
                self._send(status, body, headers, head=False)
                return
            # Announce the whole body, send part of it, then drop the connection.
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

    return Handler
