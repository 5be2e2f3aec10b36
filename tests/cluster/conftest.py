"""Fixtures: `llmir serve ART --ray` in a subprocess, its own local Ray head on 127.0.0.1.

Ray is a test dependency: without it these tests skip with a reason, except in CI (CI=true),
where a missing ray fails them. Every driver is stopped with SIGTERM (its replicas drain and
the head it started goes with it) and killed if it has not exited after 90 s."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.decoder.conftest import tiny_artifact, tiny_dir, tiny_module  # noqa: F401  (fixtures)

START_S = 180.0  # a cold head, the controller, the proxy and the replicas, on 2 busy cores


def need_ray() -> None:
    """Skip (outside CI) or fail (CI=true) when ray[serve] is not installed."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "ray[serve] is not installed in CI (pip install -e '.[test]')", pytrace=False
            )
        pytest.skip(
            "ray[serve] is not installed (pip install 'llmir[cluster]')", allow_module_level=True
        )


@dataclass
class Driver:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)

    def stop(self) -> int:
        """SIGTERM, then the exit code (the replicas drain first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the driver did not exit 90 s after SIGTERM") from None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def ray_serve(art: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Driver]:
    """`llmir serve ART --ray ARGS` on a free port, answering /health."""
    port = _free_port()
    full_env = {
        **os.environ,
        "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "RAY_ADDRESS": "",  # a local head, whatever the environment says
        "RAY_USAGE_STATS_ENABLED": "0",
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "llmir_cli.app", "serve", str(art), "--ray", "--port", str(port)]
    proc = subprocess.Popen([*cmd, *args], stderr=subprocess.PIPE, text=True, env=full_env)
    driver = Driver(proc, f"http://127.0.0.1:{port}")
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            driver.lines.append(line)
            if re.search(rf"serving .* on http://127\.0\.0\.1:{port}/", line):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + START_S
        while not ready.wait(0.2):
            assert proc.poll() is None, "driver exited:\n" + "".join(driver.lines)
            assert time.monotonic() < deadline, "no start line:\n" + "".join(driver.lines)
        while True:
            try:
                urllib.request.urlopen(driver.url + "/health", timeout=10).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "no /health:\n" + "".join(driver.lines)
                time.sleep(0.2)
        yield driver
    finally:
        if proc.poll() is None:
            driver.stop()
