"""`llmir serve ART --ray --address HOST:PORT`: joining a cluster that `ray start --head` runs (on
127.0.0.1, with Ray's token authentication, as `ray start` sets it up), and stopping a driver
whose deployment can never be ready.

The head gets 2 CPUs: one replica (1 CPU) deploys; three never do (the third cannot be
placed), so only a signal ends that driver's wait.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Driver, _free_port, need_ray

need_ray()
openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")


def _env(auth: bool, token: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    }
    env["PYTHONPATH"] = os.getcwd() + os.pathsep + env.get("PYTHONPATH", "")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if auth:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    return env


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(address, token) of a `ray start --head --block` on 127.0.0.1 with 2 CPUs. Stopped by
    SIGTERM to that process (it stops the processes it started), never `ray stop`, which would
    stop every Ray process on the machine, another test's head included."""
    token = secrets.token_hex(32)
    port = _free_port()
    env = _env(True, token)
    start = [RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1"]
    start += ["--num-cpus=2", "--include-dashboard=false"]
    temp = tmp_path_factory.mktemp("ray")
    log = open(temp / "head.log", "w")  # closed below
    proc = subprocess.Popen(
        [*start, f"--temp-dir={temp}"], env=env, stdout=log, stderr=log, start_new_session=True
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while _status(address, env).returncode != 0:
            assert proc.poll() is None, (temp / "head.log").read_text()
            assert time.monotonic() < deadline, "the head did not start in 120 s"
            time.sleep(1.0)
        yield address, token
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


RAY = shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"


def _status(address: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RAY, "status", f"--address={address}"], capture_output=True, text=True, env=env, timeout=60
    )


SERVE_PORT = _free_port()  # a cluster keeps the HTTP port its first Serve app started with


def _driver(art: Path, address: str, env: dict[str, str], *args: str) -> Driver:
    port = SERVE_PORT
    cmd = [sys.executable, "-m", "llmir_cli.app", "serve", str(art), "--ray"]
    cmd += ["--address", address, "--port", str(port), "--threads", "1", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    driver = Driver(proc, f"http://127.0.0.1:{port}")

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            driver.lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return driver


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=5).read()
        return True
    except (OSError, urllib.error.HTTPError):
        return False


def _until(cond: object, driver: Driver, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert driver.proc.poll() is None, f"driver exited:\n{''.join(driver.lines)}"
        assert time.monotonic() < deadline, f"no {what}:\n{''.join(driver.lines)}"
        time.sleep(0.25)


def test_without_the_token_one_error_with_the_way_in(
    tiny_artifact: Path, head: tuple[str, str]
) -> None:
    address, token = head
    r = subprocess.run(
        [sys.executable, "-m", "llmir_cli.app", "serve", str(tiny_artifact), "--ray"]
        + ["--address", address, "--port", "0"],
        capture_output=True,
        text=True,
        env=_env(False, token),
        timeout=180,
    )
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"cannot join the Ray cluster at {address}" in errors[0]
    assert "RAY_AUTH_MODE=token" in r.stderr and "Traceback" not in r.stderr


def test_join_serve_and_leave(tiny_artifact: Path, head: tuple[str, str]) -> None:
    """A replica on the joined cluster answers the openai client; SIGTERM removes llmir's
    application and leaves the cluster running."""
    address, token = head
    driver = _driver(tiny_artifact, address, _env(True, token), "--replicas", "1")
    try:
        _until(lambda: any("serving " in ln for ln in driver.lines), driver, 180, "start line")
        assert f"on the Ray cluster at {address}" in "".join(driver.lines)
        client = openai.OpenAI(base_url=driver.url + "/v1", api_key="x", max_retries=0)
        got = client.completions.create(model="llama", prompt="Hi", max_tokens=4, temperature=0)
        assert got.choices[0].text and got.usage.completion_tokens == 4
    finally:
        code = driver.stop()
    assert code == 0, "".join(driver.lines)
    assert not _answers(driver.url)  # the application is gone (the proxy answers 404, or none)
    status = _status(address, _env(True, token))
    assert status.returncode == 0, status.stderr  # the head runs on


def test_sigterm_while_replicas_cannot_be_placed(
    tiny_artifact: Path, head: tuple[str, str]
) -> None:
    """3 replicas of 1 CPU on 2 CPUs: the deployment never becomes ready. SIGTERM (twice, as a
    supervisor may send it) ends the wait: the application is removed, exit 0."""
    address, token = head
    driver = _driver(tiny_artifact, address, _env(True, token), "--replicas", "3")
    try:
        _until(lambda: _answers(driver.url), driver, 180, "/health from the placed replicas")
        time.sleep(1.0)
        assert not any("serving " in ln for ln in driver.lines)  # still not ready
        driver.proc.send_signal(signal.SIGTERM)
        driver.proc.send_signal(signal.SIGTERM)
        code = driver.proc.wait(60)
    finally:
        if driver.proc.poll() is None:
            driver.proc.kill()
            driver.proc.wait()
    assert code == 0, "".join(driver.lines)
    assert any("stopping before the deployment was ready" in ln for ln in driver.lines)
    _until_gone = time.monotonic() + 30
    while _answers(driver.url) and time.monotonic() < _until_gone:
        time.sleep(0.5)
    assert not _answers(driver.url), "".join(driver.lines)
