"""A tiny tracing facade: the core marks its stages here; OpenTelemetry records them when on.

The core calls `span("prefill", {...})` at stage boundaries (import, each optimize pass, build,
artifact load, tokenize, prefill, decode). While tracing is off (the default) `span` returns one
shared no-op object: no OpenTelemetry import, no allocation beyond the call. A front end (the
CLI's `--trace FILE`, or OTEL_EXPORTER_OTLP_ENDPOINT) turns it on with `enable(tracer)`, passing
an OpenTelemetry `Tracer`; this module never imports OpenTelemetry itself.

Attribute names follow the OpenTelemetry GenAI semantic conventions where one fits
(`gen_ai.request.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, ...) and
are `llmir.*` otherwise (`llmir.kv_cache.bytes`, `llmir.quantization`, `llmir.target`,
`llmir.threads`, ...). Values that are None are dropped; other values must be str, bool, int,
float or a sequence of one of those.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

_tracer: Any = None  # an opentelemetry.trace.Tracer while tracing is on
_common: dict[str, Any] = {}  # attributes every span started from now on carries

F = TypeVar("F", bound=Callable[..., Any])


class _NoSpan:
    """The span handed out while tracing is off: every method does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, attrs: Mapping[str, Any] | None = None, **kw: Any) -> None:
        return None

    def event(self, name: str, attrs: Mapping[str, Any] | None = None) -> None:
        return None

    def error(self, message: str) -> None:
        return None


NO_SPAN = _NoSpan()


def _clean(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (attrs or {}).items():
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            v = [
                x if isinstance(x, (str, bool, int, float)) else str(x) for x in v if x is not None
            ]
        elif not isinstance(v, (str, bool, int, float)):
            v = str(v)
        out[k] = v
    return out


class Span:
    """An OpenTelemetry span, with None-dropping attribute setters."""

    __slots__ = ("otel",)

    def __init__(self, otel: Any) -> None:
        self.otel = otel

    def set(self, attrs: Mapping[str, Any] | None = None, **kw: Any) -> None:
        """Set attributes (a mapping, since names hold dots; keywords for plain names)."""
        merged = _clean({**(attrs or {}), **kw})
        if merged:
            self.otel.set_attributes(merged)

    def event(self, name: str, attrs: Mapping[str, Any] | None = None) -> None:
        self.otel.add_event(name, _clean(attrs))

    def error(self, message: str) -> None:
        """Mark the span failed (an error the user sees, not an exception to record)."""
        from opentelemetry.trace import Status, StatusCode

        self.otel.set_status(Status(StatusCode.ERROR, message))


@contextmanager
def _real_span(name: str, attrs: Mapping[str, Any] | None) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        name,
        attributes=_clean({**_common, **(attrs or {})}),
        record_exception=False,
        set_status_on_exception=False,
    ) as s:
        try:
            yield Span(s)
        except BaseException as exc:
            code = getattr(exc, "exit_code", getattr(exc, "code", None))
            if type(exc).__name__ in ("Exit", "SystemExit"):  # a CLI exit: an error unless 0
                if code:
                    Span(s).error(f"exit code {code}")
            else:
                s.record_exception(exc)
                Span(s).error(f"{type(exc).__name__}: {exc}")
            raise


def span(name: str, attrs: Mapping[str, Any] | None = None) -> Any:
    """A context manager for one stage; yields an object with `set`, `event` and `error`."""
    if _tracer is None:
        return NO_SPAN
    return _real_span(name, attrs)


def current() -> Span | _NoSpan:
    """The innermost open span (to add attributes to it), or the no-op span."""
    if _tracer is None:
        return NO_SPAN
    from opentelemetry import trace

    s = trace.get_current_span()
    return Span(s) if s.is_recording() else NO_SPAN


def traced(
    name: str,
    before: Callable[..., Mapping[str, Any]] | None = None,
    after: Callable[[Any], Mapping[str, Any]] | None = None,
) -> Callable[[F], F]:
    """Decorate a stage function: one span per call, attributes from `before(*args, **kwargs)`
    and from `after(result)`. Off, the cost is one check per call."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if _tracer is None:
                return fn(*args, **kwargs)
            with span(name, before(*args, **kwargs) if before else None) as sp:
                result = fn(*args, **kwargs)
                if after is not None:
                    sp.set(after(result))
                return result

        return inner  # type: ignore[return-value]

    return wrap


def set_common(attrs: Mapping[str, Any]) -> None:
    """Attributes for every span started from now on (e.g. the model once it is loaded)."""
    if _tracer is not None:
        _common.update(_clean(attrs))


def enabled() -> bool:
    return _tracer is not None


def enable(tracer: Any) -> None:
    """Record spans through `tracer` (an OpenTelemetry Tracer) from now on."""
    global _tracer
    _tracer = tracer


def disable() -> None:
    global _tracer
    _tracer = None
    _common.clear()


__all__ = [
    "span",
    "traced",
    "set_common",
    "current",
    "enabled",
    "enable",
    "disable",
    "NO_SPAN",
    "Span",
]
