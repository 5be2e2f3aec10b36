"""Rendering and the output contract.

Results go to stdout, everything else (logs, progress, diagnostics) to stderr.
JSON results carry a `schema_version`. Colour follows NO_COLOR and whether the
stream is a terminal. Errors map to the documented exit codes; a traceback is
shown only with --debug.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from llmir_core.errors import DISK_ERRNO_HINTS, EXIT_USAGE, Diagnostic, LlmirError
from llmir_core.interrupts import caused_by_interrupt

from ._options import OutputFormat
from ._signals import announce

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1


def _no_color() -> bool:
    return "NO_COLOR" in os.environ and os.environ["NO_COLOR"] != ""


def make_console(stderr: bool) -> Console:
    from rich.console import Console  # rich loads on the first styled line, not at startup

    stream = sys.stderr if stderr else sys.stdout
    return Console(
        file=stream,
        no_color=_no_color(),
        highlight=False,
        soft_wrap=True,
        force_terminal=None if stream.isatty() else False,
    )


@dataclass
class Ctx:
    """Per-invocation output settings, created by every command."""

    fmt: OutputFormat = OutputFormat.human
    quiet: bool = False
    verbose: bool = False
    debug: bool = False

    @cached_property
    def out(self) -> Console:
        return make_console(stderr=False)

    @cached_property
    def err(self) -> Console:
        return make_console(stderr=True)

    @property
    def json(self) -> bool:
        return self.fmt == OutputFormat.json

    def log(self, message: str) -> None:
        """A progress/log line on stderr (hidden by --quiet)."""
        if not self.quiet:
            self.err.print(message, markup=False)

    def detail(self, message: str) -> None:
        """A line shown only with --verbose."""
        if self.verbose and not self.quiet:
            self.err.print(message, markup=False)

    def result(self, text: str) -> None:
        """Plain text result on stdout (no markup, no wrapping)."""
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        sys.stdout.flush()

    def emit_json(self, kind: str, data: dict[str, Any]) -> None:
        payload = {"schema_version": SCHEMA_VERSION, "kind": kind, **data}
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()

    def diagnostics(self, diags: list[Diagnostic]) -> None:
        for d in diags:
            sys.stderr.write(d.render() + "\n")
        sys.stderr.flush()


def make_ctx(
    fmt: OutputFormat = OutputFormat.human,
    quiet: bool = False,
    verbose: bool = False,
    debug: bool = False,
) -> Ctx:
    return Ctx(fmt=fmt, quiet=quiet, verbose=verbose, debug=debug)


@contextmanager
def handle_errors(ctx: Ctx) -> Iterator[None]:
    """Map llmir errors to one clear line (plus hint) and the documented exit code."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise typer.Exit(announce()) from None
    except BaseException as exc:
        if caused_by_interrupt(exc):  # an error an interrupt turned into (ImportError, say)
            raise typer.Exit(announce()) from None
        _report(ctx, exc)


def _report(ctx: Ctx, exc: BaseException) -> None:
    """Report an error that escaped a command as one line (and hint), then exit with its code."""
    if isinstance(exc, LlmirError):
        if ctx.debug:
            traceback.print_exception(exc)
        if ctx.json:
            ctx.emit_json(
                "error",
                {
                    "ok": False,
                    "error": exc.message,
                    "hint": exc.hint,
                    "exit_code": exc.exit_code,
                    "diagnostics": [d.to_json() for d in exc.diagnostics],
                },
            )
        if exc.diagnostics and not ctx.json:
            ctx.diagnostics(exc.diagnostics)
            if exc.hint:
                sys.stderr.write(f"hint: {exc.hint}\n")
        elif not ctx.json:
            sys.stderr.write(f"error: {exc.message}\n")
            if exc.hint:
                sys.stderr.write(f"hint: {exc.hint}\n")
        raise typer.Exit(exc.exit_code) from None
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNO_HINTS:
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"error: {where}{exc.strerror}\nhint: {DISK_ERRNO_HINTS[exc.errno]}\n")
        raise typer.Exit(EXIT_USAGE) from None
    if isinstance(exc, MemoryError):
        sys.stderr.write("error: out of memory\nhint: try a smaller model or free memory\n")
        raise typer.Exit(EXIT_USAGE) from None
    if not isinstance(exc, Exception):  # SystemExit, GeneratorExit: not errors to report
        raise exc
    _internal(ctx, exc)


def _internal(ctx: Ctx, exc: BaseException) -> NoReturn:
    """An internal error: still one line unless --debug."""
    if ctx.debug:
        traceback.print_exception(exc)
    else:
        sys.stderr.write(
            f"error: internal error: {type(exc).__name__}: {exc}\n"
            "hint: rerun with --debug for a traceback and report it\n"
        )
    raise typer.Exit(70) from None
