"""`--trace FILE` on every command, and OTLP/HTTP export when OTEL_EXPORTER_OTLP_ENDPOINT is set.

`add_trace_option(app)` gives every registered command a `--trace FILE` option. When it is given
(or the endpoint variable is set) the command runs inside a root span `llmir COMMAND`; the
core's stages (`llmir_core.tracing`) become its children. OpenTelemetry is imported only then.

The file holds OTLP JSON: one `ExportTraceServiceRequest` object (`{"resourceSpans": [...]}`,
hex trace and span ids, integer enums), the form OTLP viewers and the collector's
`otlpjsonfile` receiver read. Tracing into an existing trace file adds this command's trace to
it (its `resourceSpans` grow; the file is rewritten atomically), so
`llmir optimize ... --trace t.json && llmir bench ... --trace t.json` leaves both traces in one
file. A file that is not an OTLP JSON trace is refused before the command runs.
"""

from __future__ import annotations

import base64
import functools
import inspect
import json
import os
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from click.exceptions import Exit as ClickExit

from llmir_core import __version__
from llmir_core.errors import EXIT_USAGE

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"

TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="Append an OpenTelemetry trace of this command to FILE (OTLP JSON); "
        "OTEL_EXPORTER_OTLP_ENDPOINT also sends it over OTLP/HTTP.",
        show_default=False,
        metavar="FILE",
    ),
]


class TraceFileError(Exception):
    pass


def read_trace_file(path: str) -> list[dict[str, Any]]:
    """The resourceSpans already in an OTLP JSON trace file ([] when it is missing or empty)."""
    if not os.path.exists(path):
        return []
    if os.path.isdir(path):
        raise TraceFileError(f"{path}: is a folder, expected a trace file path")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFileError(f"{path}: cannot read it ({exc})") from None
    if not text.strip():
        return []
    docs: list[Any] = []
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:  # JSON Lines, as the OTLP file exporter writes
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TraceFileError(
                        f"{path}:{n}:{exc.colno}: not an OTLP JSON trace file ({exc.msg})"
                    ) from None
    spans: list[dict[str, Any]] = []
    for d in docs:
        if not isinstance(d, dict) or not isinstance(d.get("resourceSpans", []), list):
            raise TraceFileError(f"{path}: not an OTLP JSON trace file (no resourceSpans list)")
        spans += d.get("resourceSpans", [])
    return spans


def _hex_ids(obj: Any) -> Any:
    """OTLP JSON writes trace and span ids as hex, where protobuf's JSON mapping uses base64."""
    if isinstance(obj, dict):
        return {
            k: (
                base64.b64decode(v).hex()
                if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                else _hex_ids(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_hex_ids(x) for x in obj]
    return obj


def otlp_json(spans: Sequence[Any]) -> dict[str, Any]:
    """Finished SDK spans as one OTLP JSON ExportTraceServiceRequest."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return dict(_hex_ids(MessageToDict(encode_spans(spans), use_integers_for_enums=True)))


class JsonFileExporter:
    """Collects finished spans; on shutdown adds them to the trace file (temp + rename)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.existing = read_trace_file(path)  # refuse a bad file before the command runs
        self.spans: list[Any] = []

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans += list(spans)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        if not self.spans:
            return
        from llmir_core.fileio import write_text_atomic

        doc = otlp_json(self.spans)
        doc = {"resourceSpans": read_trace_file(self.path) + doc.get("resourceSpans", [])}
        write_text_atomic(self.path, json.dumps(doc, separators=(",", ":")) + "\n")
        self.spans = []


class Session:
    """Tracing for one command: the provider, its exporters and the root span."""

    def __init__(self, trace_file: str | None, endpoint: bool) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        except ImportError:
            raise TraceFileError(
                "tracing needs the opentelemetry-sdk package; hint: pip install 'llmir[trace]'"
            ) from None
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "llmir", "service.version": __version__})
        )
        self.file = JsonFileExporter(trace_file) if trace_file else None
        if self.file is not None:
            self.provider.add_span_processor(SimpleSpanProcessor(self.file))  # type: ignore[arg-type]
        if endpoint:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise TraceFileError(
                    f"{ENDPOINT_ENV} is set but the OTLP/HTTP exporter is not installed; "
                    "hint: pip install 'llmir[trace]'"
                ) from None
            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("llmir", __version__)

    def close(self) -> None:
        from llmir_core import tracing

        tracing.disable()
        self.provider.shutdown()  # flushes the OTLP/HTTP batch and writes the file


def _want_endpoint() -> bool:
    return bool(os.environ.get(TRACES_ENDPOINT_ENV) or os.environ.get(ENDPOINT_ENV))


def traced_command(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn with a `--trace FILE` option; the call runs in a root span `llmir NAME` when tracing."""
    hints = typing.get_type_hints(fn, include_extras=True)
    sig = inspect.signature(fn)
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
    ]
    if any(p.name == "trace" for p in params):
        return fn
    params.append(
        inspect.Parameter(
            "trace", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=TraceOpt
        )
    )

    @functools.wraps(fn)
    def run(*args: Any, trace: Path | None = None, **kwargs: Any) -> Any:
        if trace is None and not _want_endpoint():
            return fn(*args, **kwargs)
        try:
            session = Session(str(trace) if trace is not None else None, _want_endpoint())
        except TraceFileError as exc:
            msg, _, hint = str(exc).partition("; hint: ")
            sys.stderr.write(f"error: {msg}\n" + (f"hint: {hint}\n" if hint else ""))
            raise typer.Exit(EXIT_USAGE) from None
        from llmir_core import tracing

        tracing.enable(session.tracer)
        code = 0
        try:
            with tracing.span(
                f"llmir {name}",
                {
                    "llmir.command": name,
                    "llmir.version": __version__,
                    "process.command_args": sys.argv[1:],
                },
            ) as root:
                try:
                    return fn(*args, **kwargs)
                except (typer.Exit, ClickExit, SystemExit) as exc:
                    raw = getattr(exc, "exit_code", getattr(exc, "code", 0))
                    code = raw if isinstance(raw, int) else 1
                    raise
                except KeyboardInterrupt:
                    code = 130
                    raise
                finally:
                    root.set({"process.exit.code": code})
                    if code:
                        root.error(f"exit code {code}")
        finally:
            session.close()

    run.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {**hints, "trace": TraceOpt}
    return run


def add_trace_option(app: typer.Typer, prefix: str = "") -> None:
    """Give every command of app (and of its sub-apps) the --trace option."""
    for info in app.registered_commands:
        if info.callback is not None:
            name = info.name or info.callback.__name__
            info.callback = traced_command(f"{prefix}{name}", info.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_trace_option(group.typer_instance, f"{prefix}{group.name} ")
