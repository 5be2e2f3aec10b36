"""OpenTelemetry: `--trace FILE` (OTLP JSON) and OTLP/HTTP export to a receiver started here."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmir_core import tracing
from tests.conftest import REPO, run_cli

pytest.importorskip("opentelemetry.sdk")


class _Receiver(BaseHTTPRequestHandler):
    requests: list[Any]

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        type(self).requests.append((self.path, self.headers.get("Content-Type"), msg))
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[Any]]]:
    handler = type("Receiver", (_Receiver,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    finally:
        server.shutdown()
        server.server_close()


def _attrs_pb(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = (
            list(x.string_value or x.int_value for x in v.array_value.values)
            if kind == "array_value"
            else getattr(v, kind)
        )
    return out


def test_otlp_http_receiver_gets_the_bench_stages(
    tiny_artifact: Path, receiver: tuple[str, list[Any]]
) -> None:
    url, got = receiver
    r = run_cli(
        "bench",
        str(tiny_artifact),
        "--prompt-len",
        "5",
        "--gen-len",
        "3",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--threads",
        "1",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": url},
    )
    assert r.returncode == 0, r.stderr
    assert got and all(p == "/v1/traces" and ct == "application/x-protobuf" for p, ct, _ in got)
    spans, resources = [], []
    for _, _, msg in got:
        for rs in msg.resource_spans:
            resources.append(_attrs_pb(rs.resource.attributes))
            for ss in rs.scope_spans:
                spans += list(ss.spans)
    assert all(res["service.name"] == "llmir" for res in resources)
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"llmir bench", "load", "bench run", "prefill", "decode"}
    assert len({s.trace_id for s in spans}) == 1
    root = by_name["llmir bench"]
    assert root.parent_span_id == b""
    for child, parent in (
        ("load", "llmir bench"),
        ("bench run", "llmir bench"),
        ("prefill", "bench run"),
        ("decode", "bench run"),
    ):
        assert by_name[child].parent_span_id == by_name[parent].span_id, child
    load = _attrs_pb(by_name["load"].attributes)
    assert load["llmir.target"] == "onnxruntime" and load["llmir.threads"] == 1
    assert load["gen_ai.request.model"] and load["llmir.kv_cache"] == "shared_buffer"
    assert load["llmir.quantization"] == "f32"
    prefill = _attrs_pb(by_name["prefill"].attributes)
    assert (
        prefill["gen_ai.usage.input_tokens"] == 5
        and prefill["gen_ai.request.model"] == load["gen_ai.request.model"]
    )
    run = _attrs_pb(by_name["bench run"].attributes)
    assert run["gen_ai.usage.output_tokens"] == 3 and run["llmir.kv_cache.bytes"] > 0
    assert run["gen_ai.server.time_to_first_token"] > 0
    assert _attrs_pb(root.attributes)["process.exit.code"] == 0
    assert by_name["prefill"].start_time_unix_nano >= by_name["bench run"].start_time_unix_nano


def _spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = next(iter(v.values())) if v else None
    return out


def test_trace_file_collects_optimize_and_run(tiny_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    mod, opt, art = tmp_path / "m.llmir", tmp_path / "o.llmir", tmp_path / "art"
    for args in (
        ("import", str(tiny_dir), "-o", str(mod)),
        ("optimize", str(mod), "-o", str(opt)),
        ("build", str(opt), "-o", str(art)),
        ("run", str(art), "--prompt", "hi", "--max-new-tokens", "3", "--threads", "1"),
    ):
        r = run_cli(*args, "--trace", str(trace))
        assert r.returncode == 0, r.stderr
    doc = json.loads(trace.read_text())
    assert list(doc) == ["resourceSpans"] and len(doc["resourceSpans"]) == 4
    spans = _spans(doc)
    ids = {s["spanId"]: s for s in spans}
    for s in spans:  # OTLP JSON: hex ids, integer kinds, parents in the same trace
        assert len(s["traceId"]) == 32 and len(s["spanId"]) == 16 and int(s["traceId"], 16)
        assert isinstance(s["kind"], int) and int(s["endTimeUnixNano"]) >= int(
            s["startTimeUnixNano"]
        )
        if s.get("parentSpanId"):
            assert ids[s["parentSpanId"]]["traceId"] == s["traceId"]
    roots = [s["name"] for s in spans if not s.get("parentSpanId")]
    assert sorted(roots) == ["llmir build", "llmir import", "llmir optimize", "llmir run"]
    assert len({s["traceId"] for s in spans}) == 4
    by = {}
    for s in spans:
        by.setdefault(s["name"], []).append(s)
    for stage in ("import", "optimize", "build", "lower", "load"):  # one span per stage
        assert len(by[stage]) == 1, stage
    opt_span, build_span = by["optimize"][0], by["lower"][0]
    assert ids[build_span["parentSpanId"]]["name"] == "build"  # build = lower + serialize
    assert ids[by["build"][0]["parentSpanId"]]["name"] == "llmir build"
    passes = [s for s in spans if s["name"].startswith("pass ")]
    opt_passes = [p for p in passes if p["traceId"] == opt_span["traceId"]]
    assert opt_passes and all(p["parentSpanId"] == opt_span["spanId"] for p in opt_passes)
    assert {_attrs(p)["llmir.pass"] for p in opt_passes} >= {"canonicalize", "dce"}
    lowering = [p for p in passes if p["traceId"] == build_span["traceId"]]  # under `lower`
    assert lowering and all(p["parentSpanId"] == build_span["spanId"] for p in lowering)
    assert {_attrs(p)["llmir.pass"] for p in lowering} >= {
        "lower-ort-attention",
        "lower-ort-module",
    }
    assert len(opt_passes) + len(lowering) == len(passes)
    assert ids[opt_span["parentSpanId"]]["name"] == "llmir optimize"
    assert _attrs(by["build"][0])["llmir.target"] == "onnxruntime"
    assert _attrs(by["import"][0])["llmir.source"] == str(tiny_dir)
    gen = _attrs(by["generate"][0])
    assert (
        gen["gen_ai.operation.name"] == "text_completion"
        and gen["gen_ai.usage.output_tokens"] == "3"
    )
    assert int(gen["gen_ai.usage.input_tokens"]) == int(
        _attrs(by["tokenize"][0])["gen_ai.usage.input_tokens"]
    )
    assert "gen_ai.server.time_to_first_token" in gen and int(gen["llmir.kv_cache.bytes"]) > 0
    for stage in ("tokenize", "generate", "load"):
        assert ids[by[stage][0]["parentSpanId"]]["name"] == "llmir run"
    assert {ids[by[s][0]["parentSpanId"]]["name"] for s in ("prefill", "decode")} == {"generate"}


def test_trace_records_a_failed_command(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    r = run_cli(
        "build", str(tmp_path / "missing.llmir"), "-o", str(tmp_path / "a"), "--trace", str(trace)
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (root,) = _spans(json.loads(trace.read_text()))
    assert root["name"] == "llmir build" and root["status"]["code"] == 2  # STATUS_CODE_ERROR
    assert _attrs(root)["process.exit.code"] == "2"


def test_trace_refuses_a_file_that_is_not_a_trace(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("my notes\n")
    r = run_cli("fmt", "--help")
    assert "--trace" in r.stdout
    r = run_cli("verify", str(tmp_path / "x.llmir"), "--trace", str(bad))
    assert r.returncode == 2 and r.stderr.startswith(
        f"error: {bad}:1:1: not an OTLP JSON trace file"
    )
    assert "Traceback" not in r.stderr and bad.read_text() == "my notes\n"
    r = run_cli("verify", str(tmp_path / "x.llmir"), "--trace", str(tmp_path))
    assert r.returncode == 2 and "is a folder" in r.stderr


def test_tracing_off_is_a_no_op_without_opentelemetry() -> None:
    assert not tracing.enabled()
    with tracing.span("x", {"a": 1}) as s:
        s.set({"b": 2})
    assert s is tracing.NO_SPAN and tracing.current() is tracing.NO_SPAN
    code = (
        "import sys, llmir_cli.app, llmir_core.runtime.generate, llmir_core.passes.manager; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
