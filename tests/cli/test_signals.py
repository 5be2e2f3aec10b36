"""SIGINT and SIGTERM, during startup or during a command's work: exit 130, `interrupted` on
stderr, no traceback; an interrupt that breaks an import is never reported as a missing package."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llmir_core.errors import InputError
from llmir_core.interrupts import caused_by_interrupt, import_optional

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")


def _status(pid: int, key: str) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _handlers_installed(pid: int) -> bool:
    """llmir's handlers are in: SIGTERM (not caught by Python by default) is caught."""
    caught = _status(pid, "SigCgt")
    return caught is not None and bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _spawn(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "llmir_cli", *args],
        cwd=REPO,
        env=env,
        text=True,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait(cond: object, p: subprocess.Popen[str], timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not cond(p.pid):  # type: ignore[operator]
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def _assert_interrupted(p: subprocess.Popen[str]) -> None:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (p.returncode, out, err)
    assert err.endswith("interrupted\n") and err.count("interrupted") == 1, err
    assert "Traceback" not in err and "Aborted" not in err and out == "", (out, err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_startup(sig: int) -> None:
    """Sent as soon as the handlers are in, while typer and the modules are still importing."""
    p = _spawn("verify", "examples/decoder.llmir")
    _wait(_handlers_installed, p)
    p.send_signal(sig)
    _assert_interrupted(p)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_work(tmp_path: Path, sig: int) -> None:
    """`run DIR --chat` reading its turns from a pipe that stays open: blocked in the command."""
    p = _spawn("run", str(tmp_path), "--chat", stdin=subprocess.PIPE)
    _wait(_handlers_installed, p)
    idle_since, ticks = time.monotonic(), _cpu_ticks(p.pid)
    while time.monotonic() - idle_since < 0.5:  # no CPU used for 0.5 s: waiting on stdin
        time.sleep(0.05)
        now = _cpu_ticks(p.pid)
        if now != ticks:
            idle_since, ticks = time.monotonic(), now
    p.send_signal(sig)
    _assert_interrupted(p)


FAKE_EXTENSION = """
import os, signal, time
try:
    os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C lands while the "extension" initialises
    time.sleep(5)
except KeyboardInterrupt:
    pass
# what an extension module's C init does: a new ImportError, the interrupt lost
raise ImportError("numpy.core.multiarray failed to import")
"""


def test_an_interrupt_that_breaks_an_import_is_an_interrupt(tmp_path: Path) -> None:
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text(FAKE_EXTENSION)
    code = textwrap.dedent("""
        import sys, typer
        from llmir_cli import _signals
        _signals.install()
        from llmir_cli._render import handle_errors, make_ctx
        from llmir_core.targets.onnxruntime.runner import _ort
        try:
            with handle_errors(make_ctx()):
                _ort()
        except typer.Exit as e:
            print("exit", e.exit_code)
    """)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.stdout.strip() == "exit 130", (r.stdout, r.stderr)
    assert r.stderr == "interrupted\n", r.stderr


def test_import_optional_tells_missing_from_broken_from_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError, match="^not here$"):
        import_optional("llmir_no_such_module_xyz", "not here", hint="pip install it")
    (tmp_path / "llmir_broken_mod.py").write_text("import llmir_no_such_dependency_xyz\n")
    (tmp_path / "llmir_interrupted_mod.py").write_text(
        "try:\n    raise KeyboardInterrupt\nexcept KeyboardInterrupt:\n    raise ImportError('init failed')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        InputError,
        match="installed but cannot be imported: No module named 'llmir_no_such_dependency_xyz'",
    ):
        import_optional("llmir_broken_mod", "not here", hint="pip install it")
    with pytest.raises(KeyboardInterrupt):
        import_optional("llmir_interrupted_mod", "not here", hint="pip install it")
    assert not caused_by_interrupt(ValueError("plain"))


def test_a_solver_child_leaves_the_interrupt_to_its_parent() -> None:
    """The group-wide Ctrl-C reaches forked solver children too: they must not print tracebacks."""
    from llmir_core.smt.solver import run_job

    res = run_job(_signal_self_then_answer, limit_s=60)
    assert res["verdict"] == "proved", res


def _signal_self_then_answer() -> dict[str, object]:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    return {"verdict": "proved"}


BUILD_INTERRUPTED = """
import os, signal, sys
from llmir_cli.main import main

where = sys.argv.pop()

def interrupting(real):
    def call(*args, **kwargs):  # a real SIGINT, delivered at this call (once)
        setattr(os, real.__name__, real)
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)
    return call

names = {"weights": ["pwrite", "copy_file_range"], "swap": ["rename"]}[where]
for name in names:
    if hasattr(os, name):
        setattr(os, name, interrupting(getattr(os, name)))
sys.argv = ["llmir", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("where", ["weights", "swap"])
def test_sigint_mid_build_leaves_nothing(tmp_path: Path, where: str) -> None:
    """The signal lands while the artifact's weights are written, or right before the finished
    temp folder is moved into place: exit 130, `interrupted`, and neither the output folder nor
    its temp folder is left."""
    import numpy as np

    from tests.inputs.damage import TEXT

    np.ones((16, 16), np.float32).tofile(tmp_path / "w.bin")
    (tmp_path / "m.llmir").write_text(TEXT)
    before = sorted(os.listdir(tmp_path))
    argv = ["build", str(tmp_path / "m.llmir"), "-o", str(tmp_path / "out"), where]
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, "-c", BUILD_INTERRUPTED, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=REPO,
    )
    assert p.returncode == 130, (p.returncode, p.stdout, p.stderr)
    assert p.stderr == "interrupted\n", p.stderr
    assert sorted(os.listdir(tmp_path)) == before
