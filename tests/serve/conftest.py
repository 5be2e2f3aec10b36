"""Fixtures: the tiny decoder artifact of tests/decoder, served in-process on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.decoder.conftest import tiny_artifact, tiny_dir, tiny_module  # noqa: F401  (fixtures)

pytest.importorskip("starlette", reason="the serve extra (starlette) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")


@dataclass
class Running:
    url: str
    model: Any  # ServedModel
    server: Any  # uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(
    art: Path, *, api_key: str | None = None, playground: dict[str, Any] | None = None, **opts: Any
) -> Running:
    """Serve the artifact from a thread on a free port; wait until it answers."""
    import urllib.request

    from llmir_core.serve.model import open_served_model
    from llmir_core.serve.server import bind, make_server

    opts.setdefault("threads", 1)
    model = open_served_model(str(art), **opts)
    sock = bind("127.0.0.1", 0)
    server = make_server(model, api_key=api_key, playground=playground)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=5).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    return Running(url, model, server, thread)


@contextlib.contextmanager
def spawn_serve(art: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`llmir serve ART --port 0 ARGS` in a subprocess, answering /health: (process, URL).
    Killed at the end if it is still running."""
    import urllib.request

    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "llmir_cli.app", "serve", str(art), "--port", "0", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, line + proc.stderr.read()
        url = f"http://127.0.0.1:{found.group(1)}"
        for _ in range(600):  # the log line comes just before uvicorn starts listening
            try:
                urllib.request.urlopen(url + "/health", timeout=30).read()
                break
            except OSError:
                time.sleep(0.05)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def served(tiny_artifact: Path) -> Iterator[Running]:  # noqa: F811
    run = start_server(tiny_artifact, max_batch=8, max_queue=8, chunk=8)
    yield run
    run.stop()


@pytest.fixture(scope="session")
def full_artifact(tiny_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The tiny model built with every position's logits (`llmir build --logits all`)."""
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    out = tmp_path_factory.mktemp("art_full") / "llama"
    build_decoder(tiny_module, str(out), last_logits=False)
    return out


@pytest.fixture(scope="session")
def served_full(full_artifact: Path) -> Iterator[Running]:
    run = start_server(full_artifact, max_batch=4, max_queue=8, chunk=8)
    yield run
    run.stop()
