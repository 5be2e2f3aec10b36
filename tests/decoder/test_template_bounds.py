"""Chat templates render within bounds (llmir_core/runtime/chat_template.py): a hostile template
is stopped by its work, size or time limit, and any template error is one line, exit 2 (never
a hang, never exit 70); real templates render as before."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.runtime.chat_template import TIMEOUT_ENV, render_chat, template_timeout

from .tiny import CHATML

MSGS = [{"role": "user", "content": "hi"}]
NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
RECURSIVE = (  # loop(x) iterates without a {% for %} of its own
    "{% for x in [range(100000)|list] recursive %}{% if x is iterable %}"
    + "{{ loop(x) }}" * 12
    + "{% endif %}{% endfor %}"
)

HOSTILE = {
    "nested ranges": (NESTED, "stopped"),  # work or time, whichever comes first
    "nested loops over a list": (
        "{% set l = range(100000)|list %}{% for i in l %}{% for j in l %}{% endfor %}{% endfor %}",
        "stopped",
    ),
    "recursive loop": (RECURSIVE, "stopped"),
    "string times a billion": ("{{ 'a' * 1000000000 }}", "larger than"),
    "doubling with ~": (
        "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        "larger than",
    ),
    "doubling with +": (
        "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}",
        "larger than",
    ),
    "huge integer": ("{{ 7 ** 100000000 }}", "bits"),
    "wide format": ("{{ '%999999999d' % 1 }}", "field width"),
    "wide str.format": ("{{ '{:>999999999}'.format(1) }}", "field width"),
    "wide center": ("{{ 'a'|center(1000000000) }}", "center()"),
    "amplifying replace": ("{{ ('a' * 100000)|replace('a', 'b' * 100000) }}", "replace()"),
    "amplifying indent": ("{{ ('\\n' * 4000000)|indent(60000) }}", "indent()"),
    "huge output": (
        "{% set s = 'a' * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
        "rendered more than",
    ),
    "tojson indent": ("{{ messages|tojson(indent=100000) }}", "indent"),
    "division by zero": ("{{ 1/0 }}", "failed: ZeroDivisionError"),
    "endless macro recursion": (
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "recursed too deeply",
    ),
    "syntax error": ("{% for %}", "failed: line 1"),
    "raise_exception": ("{{ raise_exception('only user and assistant') }}", "only user and"),
    "sandbox escape": ("{{ messages.__class__.__mro__ }}", "failed"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_template_is_stopped(case: str) -> None:
    template, message = HOSTILE[case]
    t0 = time.monotonic()
    with pytest.raises(InputError, match="the model's chat template") as info:
        out = render_chat(template, MSGS)
        pytest.fail(f"rendered {len(out)} characters")
    assert message in str(info.value)
    assert time.monotonic() - t0 < 30  # the 2 s limit, with room for a busy machine


@pytest.mark.parametrize("template", [NESTED, RECURSIVE], ids=["nested", "recursive"])
def test_work_limit_stops_a_loop_before_the_clock(template: str) -> None:
    with pytest.raises(InputError, match=r"it did more than 1000000 steps of work"):
        render_chat(template, MSGS, timeout=600)


def test_time_limit_stops_a_slow_template() -> None:
    t0 = time.monotonic()
    with pytest.raises(InputError, match=r"ran longer than 0\.05 s \(--template-timeout"):
        render_chat(NESTED, MSGS, timeout=0.05)
    assert time.monotonic() - t0 < 1


def test_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert template_timeout() == 2.0
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    assert template_timeout() == 0.5 and template_timeout(3) == 3
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(InputError, match=f"{TIMEOUT_ENV}='soon': not a number of seconds"):
        template_timeout()
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(InputError, match="--template-timeout must be a positive number"):
            template_timeout(bad)


REAL = {
    "chatml": (CHATML, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    "loop variables and filters": (
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ m.role|upper }}"
        "{% if loop.last %}.{% endif %}{% endfor %}{{ messages|tojson(indent=2)|length > 0 }}",
        "1/1USER.True",
    ),
    "namespace and string methods": (
        "{% set ns = namespace(n=0) %}{% for m in messages * 3 %}{% set ns.n = ns.n + 1 %}"
        "{% endfor %}{{ ns.n }}{{ messages[0].content.strip().replace('h', 'H') }}"
        "{{ '%03d' % 7 }}{{ '{}!'.format('x') }}",
        "3Hi007x!",
    ),
    "recursive loop": (
        "{% for x in [[1, [2]], 3] recursive %}{% if x is iterable %}{{ loop(x) }}"
        "{% else %}{{ x }}{% endif %}{% endfor %}",
        "123",
    ),
}


@pytest.mark.parametrize("case", list(REAL))
def test_real_templates_render(case: str) -> None:
    template, want = REAL[case]
    assert render_chat(template, MSGS) == want


def with_template(src: Path, dst: Path, template: str) -> Path:
    """A copy of the artifact with another chat template (its manifest entry updated)."""
    shutil.copytree(src, dst)
    data = template.encode()
    (dst / "chat_template.jinja").write_bytes(data)
    m = json.loads((dst / "manifest.json").read_text())
    m["files"]["chat_template.jinja"] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
    }
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args), env=env)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stderr


@pytest.mark.parametrize(
    "template, message",
    [
        (NESTED, "the model's chat template was stopped: it "),
        ("{{ 1/0 }}", "the model's chat template failed: ZeroDivisionError: division by zero"),
    ],
)
def test_run_chat_with_a_hostile_template_exits_2(
    tiny_artifact: Path, tmp_path: Path, template: str, message: str
) -> None:
    art = with_template(tiny_artifact, tmp_path / "art", template)
    t0 = time.monotonic()
    code, err = _run("run", str(art), "--chat", "--prompt", "hi", "-n", "1")
    assert code == 2 and "Traceback" not in err, err
    assert [ln for ln in err.splitlines() if "error:" in ln] == [f"error: {message}"] or (
        message in err and err.count("error:") == 1
    ), err
    assert time.monotonic() - t0 < 120  # it never ended (the first open may compile llmir_ops)


def test_run_template_timeout_option_and_env(tiny_artifact: Path, tmp_path: Path) -> None:
    art = with_template(tiny_artifact, tmp_path / "art", NESTED)
    code, err = _run("run", str(art), "--chat", "-p", "hi", "--template-timeout", "0.05")
    assert code == 2 and "ran longer than 0.05 s" in err, err
    code, err = _run("run", str(art), "--chat", "-p", "hi", env={TIMEOUT_ENV: "0.05"})
    assert code == 2 and "ran longer than 0.05 s" in err, err
    code, err = _run("run", str(art), "--chat", "-p", "hi", "--template-timeout", "0")
    assert code == 2 and "--template-timeout must be a positive number of seconds" in err, err
