"""Chat templates rendered with bounds: a template from a downloaded model cannot hang or exhaust us.

Hugging Face chat templates are Jinja programs. They render in jinja2's immutable sandbox (no
attribute access to internals, no mutation of the inputs) with the conventions transformers'
`apply_chat_template` uses (`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII),
and with limits the sandbox alone lacks (it caps each `range()`, not the total work):

- **work**: every loop iteration, call, attribute or item lookup, intercepted operator and output
  piece is one step; past `MAX_STEPS` the render stops;
- **time**: each step also checks a wall-clock deadline (`timeout` seconds, default 2, from
  `--template-timeout` or `LLMIR_TEMPLATE_TIMEOUT`);
- **size**: strings, lists and integers a template builds (`*`, `**`, `+`, `%`, `~`, a call's
  result, the rendered text) are bounded (`MAX_TEXT` characters or items, `MAX_INT_BITS` bits),
  checked before the work where the size is known in advance, so one operation cannot allocate
  gigabytes or spend minutes in C.

Every 1024 steps the render yields the interpreter lock (`time.sleep(0)`), so a server's event
loop waits about a millisecond for it, not the interpreter's 5 ms switch interval per handoff.

Loops are counted by wrapping each `{% for %}` iterable (and the iterable a recursive `loop()`
gets) in a counting iterator at compile time. Because the checks run inside the render, the
render stops by itself within the limit: a caller can run it on any thread (the server uses its
worker threads) and needs no signal or subprocess. Every failure (a limit, a syntax error,
`raise_exception`, `{{ 1/0 }}`, runaway recursion) is one `InputError` (exit 2).
"""

from __future__ import annotations

import contextvars
import functools
import json
import math
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from llmir_core.errors import InputError
from llmir_core.interrupts import import_optional

DEFAULT_TIMEOUT_S = 2.0
TIMEOUT_ENV = "LLMIR_TEMPLATE_TIMEOUT"
MAX_STEPS = 1_000_000
MAX_TEXT = 1 << 22  # characters in a string, items in a list, characters rendered (4 Mi)
MAX_INT_BITS = 4096
MAX_ESTIMATE = 1 << 26  # characters an amplifying call (replace, indent, join...) may make
_WIDE_FORMAT = re.compile(r"\d{7,}")  # a field width or precision of a million or more
# calls whose result can be far larger than their arguments (sizes multiply): estimated first
_AMPLIFYING = frozenset(
    {"replace", "join", "center", "ljust", "rjust", "zfill", "expandtabs", "indent", "wordwrap"}
)


class TemplateLimit(Exception):
    """A chat template went past one of its bounds."""


@dataclass
class _Budget:
    steps: int
    deadline: float
    timeout: float

    def spend(self, n: int = 1) -> None:
        self.steps -= n
        if self.steps & 1023 == 0:
            time.sleep(0)  # let other threads (a server's event loop) have the interpreter
        if self.steps < 0:
            raise TemplateLimit(f"it did more than {MAX_STEPS} steps of work")
        if time.monotonic() > self.deadline:
            raise TemplateLimit(
                f"it ran longer than {self.timeout:g} s (--template-timeout, {TIMEOUT_ENV})"
            )


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "llmir_template_budget", default=None
)


def _spend(n: int = 1) -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.spend(n)


def _length(value: Any) -> int:
    """Characters or items of a string or container (0 for anything else)."""
    return len(value) if isinstance(value, str | bytes | list | tuple | dict | set) else 0


def _bounded(value: Any, what: str) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimit(f"{what} made an integer of more than {MAX_INT_BITS} bits")
    if _length(value) > MAX_TEXT:
        raise TemplateLimit(f"{what} made a value larger than {MAX_TEXT} characters or items")
    return value


def _check_binop(op: str, left: Any, right: Any) -> None:
    """Refuse an operation whose result would be too large, before Python computes it."""
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
    if op == "**" and ints and right > 0:
        if max(abs(left).bit_length(), 1) * right > MAX_INT_BITS and abs(left) > 1:
            raise TemplateLimit(f"'**' would make an integer of more than {MAX_INT_BITS} bits")
    elif op == "*" and ints:
        if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"'*' would make an integer of more than {MAX_INT_BITS} bits")
    elif op == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(n, int) and _length(seq) * max(n, 0) > MAX_TEXT:
            raise TemplateLimit(f"'*' would make a value larger than {MAX_TEXT} characters")
    elif op == "+" and _length(left) + _length(right) > MAX_TEXT:
        raise TemplateLimit(f"'+' would make a value larger than {MAX_TEXT} characters")
    elif op == "%" and isinstance(left, str) and _WIDE_FORMAT.search(left):
        raise TemplateLimit("'%' with a field width of a million characters or more")


def _check_args(name: str, args: Sequence[Any]) -> None:
    """Refuse a call with a huge number, or an amplifying one whose result would be too large:
    the estimate multiplies the two longest arguments (e.g. replace's string and its
    replacement, join's list and separator) and the numbers (e.g. a width)."""
    ints = [abs(a) for a in args if isinstance(a, int) and not isinstance(a, bool)]
    if any(i > MAX_TEXT for i in ints):
        raise TemplateLimit(f"{name}() with the argument {max(ints)} (limit {MAX_TEXT})")
    if name not in _AMPLIFYING:
        return
    lengths = sorted((_length(a) for a in args), reverse=True) + [0, 0]
    estimate = (lengths[0] + 1) * (lengths[1] + 1)
    for i in ints:
        estimate *= max(i, 1)
    if estimate > MAX_ESTIMATE:
        raise TemplateLimit(f"{name}() could make a value of {estimate} characters")


class _Counted:
    """An iterable that spends one step per item (a `{% for %}` loop's iterable)."""

    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            _spend()
            yield item

    def __len__(self) -> int:
        return len(self.iterable)  # TypeError when unsized: the loop then counts as it goes


@functools.cache
def _environment() -> Any:
    """The bounded sandbox (built once: jinja2 is imported on first use), with the settings,
    filters and globals transformers gives chat templates; every filter is bounded."""
    sandbox = import_optional(
        "jinja2.sandbox",
        "rendering a chat template needs the `jinja2` package",
        hint="pip install jinja2",
    )
    env = _sandbox_class(sandbox)(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _sandbox_class(sandbox: Any) -> Any:
    """jinja2's immutable sandbox whose every call, operator, attribute, item, `~` and loop
    step spends from the render's budget, with each result's size checked."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.runtime import LoopContext

    class CountingCodeGenerator(CodeGenerator):  # type: ignore[misc]
        def visit_For(self, node: Any, frame: Any) -> None:
            if not getattr(node, "llmir_counted", False):
                node.llmir_counted = True
                node.iter = nodes.Call(
                    nodes.EnvironmentAttribute("llmir_counted"),
                    [node.iter],
                    [],
                    None,
                    None,
                    lineno=node.lineno,
                )
            super().visit_For(node, frame)

        def visit_Concat(self, node: Any, frame: Any) -> None:  # `a ~ b`: size-checked
            self.write("environment.llmir_bounded(")
            super().visit_Concat(node, frame)
            self.write(", '~')")

    class BoundedSandbox(sandbox.ImmutableSandboxedEnvironment):  # type: ignore[misc,name-defined]
        code_generator_class = CountingCodeGenerator
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        @staticmethod
        def llmir_counted(iterable: Any) -> _Counted:
            return _Counted(iterable)

        @staticmethod
        def llmir_bounded(value: Any, what: str) -> Any:
            _spend()
            return _bounded(value, what)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            _spend()
            receiver = getattr(__obj, "__self__", None)
            name = getattr(__obj, "__name__", "a call") if isinstance(receiver, str) else "a call"
            _check_args(name, (receiver, *args, *kwargs.values()))
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
                args = (_Counted(args[0]), *args[1:])
            result = super().call(__context, __obj, *args, **kwargs)
            return _bounded(result, "a call")

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _spend()
            _check_binop(operator, left, right)
            return _bounded(super().call_binop(context, operator, left, right), f"'{operator}'")

        def getattr(self, obj: Any, attribute: str) -> Any:
            _spend()
            value = super().getattr(obj, attribute)
            if attribute in ("format", "format_map") and isinstance(obj, str):
                if _WIDE_FORMAT.search(obj):
                    raise TemplateLimit("a format with a field width of a million or more")
            return value

        def getitem(self, obj: Any, argument: Any) -> Any:
            _spend()
            return super().getitem(obj, argument)

    return BoundedSandbox


def _bounded_filter(name: str, func: Any) -> Any:
    """The jinja filter `func`, spending from the budget and checking its arguments and result."""

    @functools.wraps(func)  # keeps jinja's pass_context/pass_environment marks
    def run(*args: Any, **kwargs: Any) -> Any:
        _spend()
        _check_args(name, (*args, *kwargs.values()))
        if name == "format" and any(isinstance(a, str) and _WIDE_FORMAT.search(a) for a in args):
            raise TemplateLimit("format with a field width of a million or more")
        return _bounded(func(*args, **kwargs), f"the filter {name}")

    return run


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    if indent is not None and not 0 <= indent <= 16:
        raise TemplateLimit(f"tojson with indent={indent} (at most 16)")
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    return _environment().from_string(template)


def template_timeout(value: float | None = None) -> float:
    """The wall-clock limit in seconds: `value`, else $LLMIR_TEMPLATE_TIMEOUT, else 2."""
    where = "--template-timeout"
    if value is None:
        env = os.environ.get(TIMEOUT_ENV)
        if env is None or not env.strip():
            return DEFAULT_TIMEOUT_S
        where = TIMEOUT_ENV
        try:
            value = float(env)
        except ValueError:
            raise InputError(f"{TIMEOUT_ENV}={env!r}: not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{where} must be a positive number of seconds, got {value}")
    return value


def render_chat(
    template: str,
    messages: Sequence[dict[str, str]],
    *,
    bos_token: str | None = None,
    eos_token: str | None = None,
    add_generation_prompt: bool = True,
    timeout: float | None = None,
    **extra: Any,
) -> str:
    """Render a Hugging Face chat template (Jinja) for `messages`, within the bounds above."""
    limit = template_timeout(timeout)
    budget = _Budget(MAX_STEPS, time.monotonic() + limit, limit)
    token = _BUDGET.set(budget)
    try:
        pieces: list[str] = []
        size = 0
        for piece in _compiled(template).generate(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **extra,
        ):
            budget.spend()
            size += len(piece)
            if size > MAX_TEXT:
                raise TemplateLimit(f"it rendered more than {MAX_TEXT} characters")
            pieces.append(piece)
        return "".join(pieces)
    except InputError:  # jinja2 is missing: its own message and hint
        raise
    except TemplateLimit as exc:
        raise InputError(
            f"the model's chat template was stopped: {exc}",
            hint="run without --chat to send the prompt as plain text",
        ) from None
    except Exception as exc:  # a template is a program: any error it raises is its own
        raise InputError(
            f"the model's chat template failed: {_describe(exc)}",
            hint="run without --chat to send the prompt as plain text",
        ) from None
    finally:
        _BUDGET.reset(token)


def _describe(exc: Exception) -> str:
    import jinja2

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, jinja2.exceptions.TemplateSyntaxError):
        return f"line {exc.lineno}: {text}"
    if isinstance(exc, jinja2.exceptions.TemplateError):
        return text or type(exc).__name__
    if isinstance(exc, RecursionError):
        return "it recursed too deeply"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = [
    "render_chat",
    "template_timeout",
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "MAX_STEPS",
    "MAX_TEXT",
]
