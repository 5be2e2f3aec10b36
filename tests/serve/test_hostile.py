"""Hostile requests and artifacts: every error is OpenAI's JSON body with its status, slow work
(parsing, chat templates, tokenizing) runs off the event loop within the queue limit, a
hostile chat template fails its request while /health keeps answering, and `serve` hashes
the artifact at start."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.artifact_check import check_artifact
from llmir_core.errors import CheckFailed
from tests.decoder.test_template_bounds import NESTED
from tests.decoder.test_template_bounds import with_template as _with_template

from .conftest import Running, spawn_serve, start_server
from .test_bad_input import call, expect, ok_request


def _health_ms(url: str) -> float:
    t0 = time.monotonic()
    status, _, _ = call(url, "GET", "/health")
    assert status == 200
    return (time.monotonic() - t0) * 1000


def test_malformed_bodies_are_json_errors(served: Running) -> None:
    m = served.model.name
    post = lambda body: call(served.url, "POST", "/v1/completions", body)  # noqa: E731
    big_int = '{"model": "' + m + '", "prompt": "x", "seed": ' + "9" * 5000 + "}"
    status, _, data = post(big_int)
    expect(status, data, 400, "invalid_json")
    assert "an integer of 5000 digits" in data["error"]["message"]
    status, _, data = post("[" * 100_000 + "]" * 100_000)
    expect(status, data, 400, "invalid_json")
    assert "nested too deeply" in data["error"]["message"]
    status, _, data = post(b'{"model": "\xff\xfe"}')
    expect(status, data, 400, "invalid_json")
    status, _, data = post(json.dumps({"model": m, "prompt": "x", "seed": 2**70}))
    expect(status, data, 400, "invalid_value", "seed")
    ok_request(served)


def test_long_prompts_are_refused_before_tokenizing(served: Running) -> None:
    model = served.model
    calls: list[int] = []
    encode = model.tokenizer.encode

    def counting(text: str, add_special_tokens: bool = True) -> list[int]:
        calls.append(len(text))
        return encode(text, add_special_tokens=add_special_tokens)

    model.tokenizer.encode = counting  # type: ignore[method-assign]
    try:
        over = "y" * (model.max_prompt_bytes + 1)
        for path, body in (
            ("/v1/completions", {"model": model.name, "prompt": over}),
            (
                "/v1/chat/completions",
                {"model": model.name, "messages": [{"role": "user", "content": over}]},
            ),
        ):
            status, _, data = call(served.url, "POST", path, json.dumps(body))
            expect(status, data, 400, "context_length_exceeded")
            assert f"more than {model.max_context} tokens can hold" in data["error"]["message"]
        assert calls == []  # neither was tokenized (nor rendered)
        ok_request(served)
        assert calls  # the valid one was
    finally:
        del model.tokenizer.encode


def test_an_unexpected_failure_is_a_json_500(
    served: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(messages: Any) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(served.model, "render_chat", broken)
    body = {"model": served.model.name, "messages": [{"role": "user", "content": "hi"}]}
    status, _, data = call(served.url, "POST", "/v1/chat/completions", json.dumps(body))
    expect(status, data, 500, "internal_error")
    assert data["error"]["type"] == "server_error"
    monkeypatch.undo()
    ok_request(served)


def test_preparing_requests_count_against_the_queue(tiny_artifact: Path) -> None:
    from llmir_core.serve.scheduler import QueueFull

    srv = start_server(tiny_artifact, max_batch=1, max_queue=1)
    sched = srv.model.scheduler
    try:
        held = [sched.reserve(), sched.reserve()]  # one free slot + one queue place
        with pytest.raises(QueueFull, match="2 requests are waiting"):
            sched.reserve()
        body = json.dumps({"model": srv.model.name, "prompt": "hi", "max_tokens": 2})
        status, headers, data = call(srv.url, "POST", "/v1/completions", body)
        expect(status, data, 429, "rate_limit_exceeded")
        assert headers["retry-after"] == "1"
        held[0].release()
        held[0].release()  # idempotent
        assert sched.preparing == 1
        ok_request(srv)
        assert sched.preparing == 1  # the request's own place was given back
        held[1].release()
        assert sched.preparing == 0
    finally:
        srv.stop()


def test_hostile_template_fails_its_request_while_health_answers(
    tiny_artifact: Path, tmp_path: Path
) -> None:
    art = _with_template(tiny_artifact, tmp_path / "art", NESTED)
    srv = start_server(art, max_batch=2, max_queue=4)
    try:
        result: dict[str, Any] = {}

        def chat() -> None:
            body = {"model": srv.model.name, "messages": [{"role": "user", "content": "hi"}]}
            result["r"] = call(srv.url, "POST", "/v1/chat/completions", json.dumps(body))

        for _ in range(3):
            _health_ms(srv.url)  # warm
        thread = threading.Thread(target=chat)
        thread.start()
        times = []
        while thread.is_alive():
            times.append(_health_ms(srv.url))
            time.sleep(0.01)
        thread.join()
        status, _, data = result["r"]
        expect(status, data, 400, "invalid_prompt", "messages")
        assert "the model's chat template was stopped" in data["error"]["message"]
        assert len(times) >= 5, times
        assert sorted(times)[len(times) * 9 // 10] < 100, times  # p90 under 100 ms
        ok_request(srv)  # completions still work
    finally:
        srv.stop()


def _flip_in_place(path: Path, at: int = 100) -> None:
    """Change one byte keeping the size, mtime and inode (as an in-place write would)."""
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino


def test_serve_hashes_the_artifact_at_start(tiny_artifact: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    shutil.copytree(tiny_artifact, art)
    check_artifact(str(art))  # hashed once: recorded with each file's size, mtime and inode
    _flip_in_place(art / "model.onnx.data")
    assert check_artifact(str(art)).hashed == []  # what `run` relies on: the record matches
    from llmir_core.serve.model import open_served_model

    with pytest.raises(CheckFailed, match=r"model\.onnx\.data: sha256 [0-9a-f]{64}, but"):
        open_served_model(str(art), max_batch=1, threads=1)
    r = CliRunner().invoke(app, ["serve", str(art), "--port", "0"])
    assert r.exit_code == 1, (r.exit_code, r.stderr)
    assert "model.onnx.data: sha256" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
def test_sigterm_while_a_hostile_template_renders(tiny_artifact: Path, tmp_path: Path) -> None:
    art = _with_template(tiny_artifact, tmp_path / "art", NESTED)
    with spawn_serve(art, "--threads", "1", "--template-timeout", "30") as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"model": art.name, "messages": [{"role": "user", "content": "hi"}]}
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        time.sleep(0.3)  # rendering now, until its work limit stops it
        assert _health_ms(url) < 1000
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        resp = conn.getresponse()
        data = json.loads(resp.read())
        assert resp.status == 400 and data["error"]["code"] == "invalid_prompt", data
        assert proc.wait(30) == 0
        assert time.monotonic() - t0 < 30


def test_workers_give_results_errors_and_abandon_slow_jobs() -> None:
    import asyncio

    from llmir_core.serve.workers import JobTimeout, Workers

    pool = Workers(1)
    gate = threading.Event()

    def fail() -> None:
        raise ValueError("bad input")

    async def main() -> None:
        assert await pool.run(lambda: 6 * 7) == 42
        with pytest.raises(ValueError, match="bad input"):
            await pool.run(fail)
        t0 = time.monotonic()
        with pytest.raises(JobTimeout, match="more than 0.2 s"):
            await pool.run(lambda: gate.wait(30), timeout=0.2)
        assert time.monotonic() - t0 < 5
        gate.set()  # the abandoned job ends; its thread takes the next one
        assert await pool.run(lambda: "next", timeout=30) == "next"

    asyncio.run(main())


def test_serve_rejects_a_bad_template_timeout(tiny_artifact: Path) -> None:
    r = CliRunner().invoke(app, ["serve", str(tiny_artifact), "--template-timeout", "-1"])
    assert r.exit_code == 2 and "--template-timeout must be a positive number" in r.stderr
    r = CliRunner().invoke(
        app, ["serve", str(tiny_artifact)], env={"LLMIR_TEMPLATE_TIMEOUT": "nan"}
    )
    assert r.exit_code == 2 and "--template-timeout must be a positive number" in r.stderr
