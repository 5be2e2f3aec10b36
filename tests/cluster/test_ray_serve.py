"""`llmir serve ART --ray` on a local Ray head: 2 replicas under 32 streaming openai clients, a
replica killed mid-stream, and autoscaling between 1 and 2 replicas.

One head at a time: the class's fixture (2 replicas) is torn down before the autoscale test
starts its own driver."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .conftest import Driver, need_ray, ray_serve

need_ray()
openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")

PROMPTS = ["Once upon a time", "The cat", "1 2 3", "Hello world"]
LONG_PROMPTS = ["Hi", "A", "Go", "The", "yes", "ok"]  # greedy: 240 tokens before any EOS


KEY = "cluster-secret"


def _client(url: str, timeout: float = 60.0, key: str = KEY) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=timeout)


def _stream(url: str, prompt: str, max_tokens: int) -> str:
    """The streamed text of a greedy completion."""
    c = _client(url)
    chunks = c.completions.create(
        model="llama", prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True
    )
    return "".join(ch.choices[0].text for ch in chunks if ch.choices)


def _metrics(url: str) -> str:
    return urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()


def _replicas(text: str) -> dict[str, dict[str, str]]:
    """replica id -> labels of llmir_replica_info, from the merged /metrics."""
    out = {}
    for m in re.finditer(r"^llmir_replica_info\{(.*)\} 1$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out[labels["replica"]] = labels
    return out


def _per_replica(text: str, name: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(rf'^{name}\{{replica="([^"]+)"\}} (\S+)$', text, re.M)
    }


def _metrics_of(url: str, n: int) -> str | None:
    """/metrics once n replicas have generated tokens (None before: the other replicas' numbers
    reach the scraped one within a push period)."""
    text = _metrics(url)
    served = _per_replica(text, "llmir_generated_tokens_total")
    return text if len(served) == n and all(v > 0 for v in served.values()) else None


def _wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


@pytest.fixture(scope="module")
def expected(tiny_artifact: Path) -> dict[str, str]:
    """Greedy texts of single-process serve (in-process, as tests/serve serves)."""
    from tests.serve.conftest import start_server

    run = start_server(tiny_artifact, max_batch=4, max_queue=8, chunk=8)
    try:
        return {p: _stream(run.url, p, 16) for p in PROMPTS}
    finally:
        run.stop()


@pytest.fixture(scope="class")
def cluster(tiny_artifact: Path) -> Iterator[Driver]:
    args = ("--replicas", "2", "--max-batch", "8", "--max-queue", "8", "--threads", "1")
    args += ("--api-key", KEY)  # checked in each replica, as single-process serve does
    with ray_serve(tiny_artifact, *args) as driver:
        yield driver
        assert driver.stop() == 0, "".join(driver.lines)
        assert any("drained" in ln for ln in driver.lines), "".join(driver.lines)


class TestTwoReplicas:
    def test_32_streams_equal_single_process(
        self, cluster: Driver, expected: dict[str, str]
    ) -> None:
        def one(i: int) -> str:
            prompt = PROMPTS[i % len(PROMPTS)]
            try:
                return "ok" if _stream(cluster.url, prompt, 16) == expected[prompt] else "differs"
            except openai.RateLimitError:
                return "429"

        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(one, range(32)))
        assert set(results) <= {"ok", "429"}, results
        assert results.count("ok") >= 16, results
        # both replicas served, each with its own scheduler
        text = _wait(lambda: _metrics_of(cluster.url, 2), 15, "2 replicas in /metrics")
        served = _per_replica(text, "llmir_generated_tokens_total")
        assert all(n > 0 for n in served.values()), served
        assert len(_per_replica(text, "llmir_queue_depth")) == 2
        assert len(_per_replica(text, "llmir_tokens_per_second")) == 2
        assert len(_replicas(text)) == 2
        with pytest.raises(openai.AuthenticationError):
            _client(cluster.url, key="wrong").models.list()

    def test_replica_killed_mid_stream(self, cluster: Driver) -> None:
        """32 streams of 240 tokens, 16 per replica (8 decoding, 8 queued in it): one replica
        killed once 8 streams are under way."""
        outcomes: list[str] = []
        lock = threading.Lock()
        streaming: list[int] = []  # streams that got their first chunk

        def one(i: int) -> None:
            c = _client(cluster.url)
            try:
                chunks = c.completions.create(
                    model="llama",
                    prompt=LONG_PROMPTS[i % len(LONG_PROMPTS)],
                    max_tokens=240,
                    temperature=0.0,
                    stream=True,
                )
                for n, _ in enumerate(chunks):
                    if n == 0:
                        with lock:
                            streaming.append(i)
                outcome = "done"
            except Exception as exc:  # openai's errors, or httpx's for a stream cut short
                outcome = type(exc).__name__
            with lock:
                outcomes.append(outcome)

        # the victim is chosen before the streams start: waiting for /metrics to show which
        # replica is busy (its push period) can take longer than a whole stream on a fast machine
        victim, labels = sorted(_replicas(_metrics(cluster.url)).items())[0]
        pid = int(labels["pid"])
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(32)]
        for t in threads:
            t.start()
        _wait(lambda: len(streaming) >= 8, 60, "8 streams under way")
        os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads), "a stream hung after the replica died"
        assert len(outcomes) == 32
        failed = [o for o in outcomes if o != "done"]
        assert failed, outcomes  # the victim's streams end with an error ...
        # a started stream is cut (a connection error); a request the dead replica had not
        # answered yet gets Ray's proxy's 500
        clean = {"APIConnectionError", "RemoteProtocolError", "InternalServerError"}
        assert set(failed) <= clean, outcomes
        assert "done" in outcomes, outcomes  # ... the other replica's finish
        # new requests are served (by the live replica, then by the one Ray restarts)
        _wait(lambda: _try_stream(cluster.url), 60, "a request served after the kill")
        for p in PROMPTS:
            assert _stream(cluster.url, p, 8)
        _wait(
            lambda: (
                len(_replicas(_metrics(cluster.url))) == 2
                and victim not in _replicas(_metrics(cluster.url))
            ),
            90,
            "Ray to restart the replica",
        )


def _try_stream(url: str, max_tokens: int = 4) -> bool:
    try:
        return bool(_stream(url, "Hi", max_tokens))
    except Exception:
        return False


def test_autoscale_up_and_down(tiny_artifact: Path) -> None:
    """1 replica at rest, 2 under 8 long streams (target: --max-batch 2 ongoing per replica),
    1 again when they stop; Ray's delays shortened through LLMIR_RAY_AUTOSCALING."""
    env = {
        "LLMIR_RAY_AUTOSCALING": json.dumps(
            {
                "upscale_delay_s": 0.5,
                "downscale_delay_s": 2.0,
                "look_back_period_s": 1.0,
                "metrics_interval_s": 0.5,
            }
        ),
        "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
        "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
    }
    args = ("--autoscale", "1,2", "--max-batch", "2", "--max-queue", "16", "--threads", "1")
    with ray_serve(tiny_artifact, *args, env=env) as driver:
        assert len(_replicas(_metrics(driver.url))) == 1
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                _try_stream(driver.url, 64)  # long streams keep ~8 requests ongoing

        threads = [threading.Thread(target=load, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            _wait(lambda: len(_replicas(_metrics(driver.url))) == 2, 90, "a scale-up to 2")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        _wait(lambda: len(_replicas(_metrics(driver.url))) == 1, 90, "a scale-down to 1")
        assert driver.stop() == 0, "".join(driver.lines)


def test_a_changed_byte_fails_the_deployment(tiny_artifact: Path, tmp_path: Path) -> None:
    """Every replica hashes the artifact: a changed byte is one error line and exit 1."""
    import shutil
    import subprocess
    import sys

    art = tmp_path / "llama"
    shutil.copytree(tiny_artifact, art)
    onnx = next(art.glob("*.onnx"))
    data = bytearray(onnx.read_bytes())
    data[-1] ^= 0xFF
    onnx.write_bytes(bytes(data))
    env = {
        **os.environ,
        "PYTHONPATH": os.getcwd(),
        "RAY_ADDRESS": "",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    cmd = [sys.executable, "-m", "llmir_cli.app", "serve", str(art), "--ray", "--port", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 1, r.stderr
    assert len(errors) == 1 and "a replica could not open the artifact" in errors[0], r.stderr
