"""Bad requests get OpenAI's error bodies and status codes, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app

from .conftest import Running, spawn_serve, start_server


def call(
    url: str,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = raw.decode()
    return resp.status, dict(resp.getheaders()), data


def ok_request(served: Running) -> None:
    body = json.dumps(
        {"model": served.model.name, "prompt": "hi", "max_tokens": 3, "temperature": 0}
    )
    status, _, data = call(served.url, "POST", "/v1/completions", body)
    assert status == 200 and data["usage"]["completion_tokens"] >= 1


def expect(
    status_got: int, data: Any, status: int, code: str | None, param: str | None = None
) -> None:
    assert status_got == status, data
    err = data["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code
    if param is not None:
        assert err["param"] == param


def test_bad_requests_keep_the_server_serving(served: Running) -> None:
    m = served.model.name
    post = lambda body, path="/v1/completions": call(served.url, "POST", path, body)  # noqa: E731
    expect(*_sd(post(b"{not json")), 400, "invalid_json")
    expect(*_sd(post(b"[1, 2]")), 400, "invalid_json")
    expect(*_sd(post(b"x" * ((1 << 20) + 1))), 413, "request_too_large")
    expect(*_sd(call(served.url, "GET", "/v1/nope")), 404, "unknown_url")
    expect(*_sd(call(served.url, "GET", "/v1/completions")), 405, "method_not_allowed")
    expect(
        *_sd(post(json.dumps({"model": "other", "prompt": "x"}))), 404, "model_not_found", "model"
    )
    expect(*_sd(post(json.dumps({"prompt": "x"}))), 400, "missing_required_parameter", "model")
    expect(*_sd(post(json.dumps({"model": m}))), 400, "missing_required_parameter", "prompt")
    expect(*_sd(post(json.dumps({"model": m, "prompt": "x", "n": 0}))), 400, "invalid_value", "n")
    expect(
        *_sd(post(json.dumps({"model": m, "prompt": "x", "top_p": 0}))),
        400,
        "invalid_value",
        "top_p",
    )
    expect(
        *_sd(post(json.dumps({"model": m, "prompt": "x", "max_tokens": 0}))),
        400,
        "invalid_value",
        "max_tokens",
    )
    expect(
        *_sd(post(json.dumps({"model": m, "prompt": "x", "stop": 3}))), 400, "invalid_type", "stop"
    )
    expect(
        *_sd(post(json.dumps({"model": m, "prompt": "y" * 300}))),
        400,
        "context_length_exceeded",
        "prompt",
    )
    expect(
        *_sd(post(json.dumps({"model": m, "messages": []}), "/v1/chat/completions")),
        400,
        "invalid_type",
        "messages",
    )
    expect(
        *_sd(
            post(
                json.dumps({"model": m, "messages": [{"role": "x", "content": "y"}]}),
                "/v1/chat/completions",
            )
        ),
        400,
        "invalid_type",
        "messages[0].role",
    )
    ok_request(served)


def _sd(r: tuple[int, dict[str, str], Any]) -> tuple[int, Any]:
    return r[0], r[2]


def test_health_and_metrics(served: Running) -> None:
    ok_request(served)
    status, _, health = call(served.url, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["slots"] == 8
    status, headers, text = call(served.url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert re.search(
        r'^llmir_requests_total\{route="/v1/completions",status="200"\} [1-9]', text, re.M
    )
    for name in (
        "llmir_queue_depth",
        "llmir_active_sequences",
        "llmir_tokens_per_second",
        "llmir_generated_tokens_total",
    ):
        assert re.search(rf"^{name} \d", text, re.M), name
    for hist in ("llmir_time_to_first_token_seconds", "llmir_inter_token_latency_seconds"):
        assert f"# TYPE {hist} histogram" in text and re.search(
            rf'^{hist}_bucket{{le="\+Inf"}} [1-9]', text, re.M
        )


def test_api_key(tiny_artifact: Path) -> None:
    srv = start_server(tiny_artifact, max_batch=1, api_key="s3cret")
    try:
        body = json.dumps({"model": srv.model.name, "prompt": "hi", "max_tokens": 2})
        status, _, data = call(srv.url, "POST", "/v1/completions", body)
        expect(status, data, 401, "invalid_api_key")
        assert "didn't provide" in data["error"]["message"]
        status, _, data = call(
            srv.url, "POST", "/v1/completions", body, {"Authorization": "Bearer wrong"}
        )
        expect(status, data, 401, "invalid_api_key")
        status, _, data = call(
            srv.url, "GET", "/api/playground", None, {"Authorization": "Bearer s3cre"}
        )
        expect(status, data, 401, "invalid_api_key")
        status, _, data = call(
            srv.url, "POST", "/v1/completions", body, {"Authorization": "Bearer s3cret"}
        )
        assert status == 200
        assert call(srv.url, "GET", "/health")[0] == 200  # health and the page need no key
    finally:
        srv.stop()


def test_full_queue_is_429_with_retry_after(tiny_artifact: Path) -> None:
    from llmir_core.runtime.sampling import Sampler, SamplingConfig
    from llmir_core.serve.scheduler import GenRequest

    srv = start_server(tiny_artifact, max_batch=1, max_queue=0)
    sched = srv.model.scheduler
    try:
        gate = GenRequest([1, 2, 3], 250, Sampler(SamplingConfig()), lambda s: None, lambda r: None)
        sched.submit(gate)  # holds the only slot for a while
        deadline = time.monotonic() + 10
        while not sched.active and time.monotonic() < deadline:
            time.sleep(0.01)
        body = json.dumps({"model": srv.model.name, "prompt": "hi", "max_tokens": 2})
        status, headers, data = call(srv.url, "POST", "/v1/completions", body)
        expect(status, data, 429, "rate_limit_exceeded")
        assert headers["retry-after"] == "1"
        sched.cancel(gate)
    finally:
        srv.stop()


def test_cli_errors(tmp_path: Path, tiny_artifact: Path) -> None:
    r = CliRunner().invoke(app, ["serve", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such artifact folder" in r.stderr
    bad = tmp_path / "bench.json"
    bad.write_text('{"decode": \n  oops}')
    r = CliRunner().invoke(app, ["serve", str(tiny_artifact), "--bench", str(bad), "--port", "0"])
    assert r.exit_code == 2 and f"{bad}:2:3: not valid JSON" in r.stderr, r.stderr
    r = CliRunner().invoke(app, ["serve", str(tiny_artifact), "--max-batch", "0"])
    assert r.exit_code == 2 and "--max-batch must be >= 1" in r.stderr


def test_cli_busy_port(tiny_artifact: Path, served: Running) -> None:
    port = served.url.rsplit(":", 1)[1]
    r = CliRunner().invoke(app, ["serve", str(tiny_artifact), "--port", port])
    assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
def test_sigterm_finishes_in_flight_and_refuses_new(tiny_artifact: Path) -> None:
    with spawn_serve(tiny_artifact, "--threads", "1") as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = {
            "model": tiny_artifact.name,
            "prompt": "tell",
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
        }
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        resp.readline()  # generating
        proc.send_signal(signal.SIGTERM)
        rest = resp.read().decode()
        assert rest.rstrip().endswith("data: [DONE]") and '"usage"' in rest  # the stream finished
        assert proc.wait(30) == 0
        with pytest.raises(ConnectionRefusedError):
            http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/health")
