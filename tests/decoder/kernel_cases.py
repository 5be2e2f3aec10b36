"""Hostile one-node cases for every ai.llmir kernel (llmir_core/targets/onnxruntime/native), each run in a
subprocess of its own so that a crash is a failed case, not a dead runner.

A case builds a one-node onnxruntime graph and a sequence of calls on one session (shapes may
grow or shrink between them); each call says what it wants: "ref" (the result must match the
numpy reference), "error" (onnxruntime must refuse it with a status: an exception raised by
onnxruntime, never a signal), "either" (one of the two: zero-size or absurd inputs where
refusing is as good as computing). A case passes when every call gets what it wants and the
process ends normally with no AddressSanitizer / UBSan report on stderr.

    python -m tests.decoder.kernel_cases OP NAME      # run one case here (prints one JSON line)
    python -m tests.decoder.kernel_cases --serve      # fork a child per case named on stdin

scripts/fuzz_kernels.py runs every case (also against the sanitized library, `--asan`);
tests/decoder/test_kernel_fuzz.py a bounded subset. LLMIR_FUZZ_LIB names the library to load
(default: llmir's cached build).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.decoder.kfuzz.attention import _gqa8_cases, _gqa_cases
from tests.decoder.kfuzz.base import (
    ASAN_MARKS,
    LIB_ENV,
    Call,
    Case,
    Feeds,
    Scenario,
    _session,
    compare,
)
from tests.decoder.kfuzz.matmul import _bf16, _mat_cases, _mat_ops, _nbits_repros
from tests.decoder.kfuzz.norm import _norm_cases

ROOT = Path(__file__).resolve().parents[2]


# -- the table -----------------------------------------------------------------------------------


def all_cases() -> list[Case]:
    out: list[Case] = []
    for mo in _mat_ops():
        out += _mat_cases(mo)
    out += _nbits_repros()
    out += _norm_cases(False) + _norm_cases(True)
    out += _gqa_cases() + _gqa8_cases()
    return out


def find(op: str, name: str) -> Case:
    for c in all_cases():
        if c.op == op and c.name == name:
            return c
    raise KeyError(f"no case {op}/{name}")


# -- one case, in this process -------------------------------------------------------------------


def _is_ort_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("onnxruntime") and bool(str(exc).strip())


def _run_call(sess: Any, call: Call) -> list[np.ndarray]:
    import onnxruntime as ort

    from llmir_core.targets.onnxruntime.session import _from_ort_value, _ort_value

    def value(a: np.ndarray) -> Any:  # _ort_value makes a 0-d array 1-d (ascontiguousarray)
        return ort.OrtValue.ortvalue_from_numpy(a) if a.ndim == 0 else _ort_value(a)

    vals = {k: value(np.asarray(v)) for k, v in call.feeds.items()}
    if not call.alias:
        return [_from_ort_value(o) for o in sess.run_with_ort_values(None, vals)]
    bind = sess.io_binding()
    for k, v in vals.items():
        bind.bind_ortvalue_input(k, v)
    names = [o.name for o in sess.get_outputs()]
    for o in names:
        if o in call.alias:
            bind.bind_ortvalue_output(o, vals[call.alias[o]])
        else:
            bind.bind_output(o, "cpu")
    sess.run_with_iobinding(bind)
    return [_from_ort_value(v) for v in bind.get_outputs()]


def run_here(case: Case) -> dict[str, Any]:
    """Run one case in this process: {"calls": [outcome per call], "verdict": ...}."""
    scen = case.make(np.random.default_rng(zlib.crc32(f"{case.op}/{case.name}".encode())))
    outcomes: list[str] = []
    try:
        sess = _session(scen.graph)
    except Exception as exc:  # refused at load: every call refused
        if not _is_ort_error(exc):
            return {"calls": [], "verdict": "harness", "detail": f"{type(exc).__name__}: {exc}"}
        sess = None
        load_error = str(exc).strip().splitlines()[0]
    for call in scen.calls:
        if sess is None:
            outcomes.append(f"error: {load_error}")
            continue
        before = {k: np.array(v, copy=True) for k, v in call.feeds.items()}
        try:
            got = _run_call(sess, call)
        except Exception as exc:
            if not _is_ort_error(exc):
                return {
                    "calls": outcomes,
                    "verdict": "harness",
                    "detail": f"{type(exc).__name__}: {exc}",
                }
            outcomes.append("error: " + str(exc).strip().splitlines()[0])
            continue
        outcomes.append(_check(scen, call, before, got))
    verdict = "pass"
    for call, out in zip(scen.calls, outcomes):
        kind = out.split(":")[0]
        if call.want == "ref" and kind != "ok":
            verdict = "fail"
        elif call.want == "error" and kind != "error":
            verdict = "fail"
        elif call.want == "either" and kind not in ("ok", "error"):
            verdict = "fail"
    return {"calls": outcomes, "verdict": verdict, "wants": [c.want for c in scen.calls]}


def _check(scen: Scenario, call: Call, feeds: Feeds, got: list[np.ndarray]) -> str:
    """got against the reference on the inputs as they were before the call; outputs bound
    onto an input are not compared (only their memory safety is checked)."""
    if scen.ref is None:
        return "ok (no reference)"
    try:
        want = scen.ref(feeds)
    except Exception as exc:  # the reference refuses these inputs: the kernel had to as well
        return f"accepted: the reference refuses ({type(exc).__name__}: {exc})"
    if len(got) != len(want):
        return f"mismatch: {len(got)} outputs, the reference has {len(want)}"
    names = list(call.alias) if call.alias else []
    skip = {i for i, n in enumerate(scen.graph.output) if n.name in names}
    for i, (g, w) in enumerate(zip(got, want)):
        if i in skip:
            continue
        if w.dtype == np.int8 or g.dtype == np.int8:
            if g.shape != w.shape or not np.array_equal(g, w):
                diff = int((g != w).sum()) if g.shape == w.shape else -1
                return (
                    f"mismatch: output {i}: {diff} int8 codes differ (shape {g.shape} vs {w.shape})"
                )
            continue
        why = compare(g, w, scen.tol, scen.ref_k)
        if why:
            return f"mismatch: output {i}: {why}"
    return "ok"


# -- one case, in a subprocess -------------------------------------------------------------------


@dataclass
class Result:
    case: Case
    status: str  # pass | fail | signal | sanitizer | timeout | crash | harness
    detail: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def asan_env(lib: str) -> dict[str, str]:
    """The environment that loads the sanitized library into a python that is not built with
    it: libasan (and libubsan) preloaded, leaks not reported (python's own), reports to stderr."""
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True)
        path = out.stdout.strip()
        if out.returncode or not os.path.isabs(path):
            raise RuntimeError(f"gcc does not know where {name} is")
        libs.append(os.path.realpath(path))
    return {
        LIB_ENV: lib,
        "LD_PRELOAD": " ".join(libs),
        "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:"
        "handle_segv=1:print_summary=1",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }


class Server:
    """A python that has imported numpy, onnx, onnxruntime and the cases once and forks a child
    per case (`python -m tests.decoder.kernel_cases --serve`): each case still runs in a
    process of its own (a crash ends only that child), without paying the imports each time.
    env: the server's extra environment (the library to load, the sanitizer's preloads)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        e = {**os.environ, **(env or {})}
        e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        e["OMP_NUM_THREADS"] = e["OPENBLAS_NUM_THREADS"] = "1"  # no BLAS pool across fork
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.decoder.kernel_cases", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=e,
        )

    def run(self, case: Case, timeout: float = 120) -> Result:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        t0 = time.perf_counter()
        self.proc.stdin.write(f"{case.op}\t{case.name}\t{timeout}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the case server exited ({self.proc.poll()})")
        return _classify(case, json.loads(line), time.perf_counter() - t0)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


_SERVERS: dict[tuple[tuple[str, str], ...], Server] = {}


def run_isolated(case: Case, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """Run one case in a child process of a server for env (started on first use)."""
    key = tuple(sorted((env or {}).items()))
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = Server(env)
    return server.run(case, timeout)


def _classify(case: Case, rep: dict[str, Any], dt: float) -> Result:
    """A child's report -> its Result: a sanitizer report, a signal, a timeout, an exit other
    than 0 or a failed check is a failure."""
    err = rep["stderr"]
    marks = [ln for ln in err.splitlines() if any(m in ln for m in ASAN_MARKS)]
    if marks:
        return Result(case, "sanitizer", marks[0].strip()[:300], dt)
    if rep["timeout"]:
        return Result(case, "timeout", f"no result within {rep['timeout']:.0f} s", dt)
    if rep["signal"]:
        return Result(case, "signal", signal.Signals(rep["signal"]).name, dt)
    if rep["rc"] != 0:
        tail = (err.strip().splitlines() or ["(no output)"])[-1]
        return Result(case, "crash", f"exit {rep['rc']}: {tail[:300]}", dt)
    try:
        data = json.loads(rep["result"])
    except json.JSONDecodeError:
        return Result(case, "harness", f"no result: {rep['result'][-200:]!r}", dt)
    detail = "; ".join(f"{w}->{c}" for w, c in zip(data.get("wants", []), data["calls"]))
    return Result(case, data["verdict"], detail or data.get("detail", ""), dt)


def _serve() -> int:
    """The server's loop: one line "op<TAB>name<TAB>timeout" in, one JSON report out."""
    import tempfile

    import onnx.helper  # noqa: F401  (imported once, here, for every child)
    import onnxruntime  # noqa: F401

    import llmir_core.quant.nbits  # noqa: F401
    import llmir_core.quant.s8  # noqa: F401
    import llmir_core.targets.onnxruntime.dialect  # noqa: F401
    import llmir_core.targets.onnxruntime.session  # noqa: F401

    table = {(c.op, c.name): c for c in all_cases()}
    _bf16()
    tmp = tempfile.mkdtemp(prefix="llmir-kcases-")
    res_path, err_path = os.path.join(tmp, "result"), os.path.join(tmp, "stderr")
    for line in sys.stdin:
        op, name, limit = line.rstrip("\n").split("\t")
        for path in (res_path, err_path):
            open(path, "w").close()
        pid = os.fork()
        if pid == 0:  # the child: its stdout and stderr into the file, the result into another
            fd = os.open(err_path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = 0
            try:
                out = run_here(table[(op, name)])
                with open(res_path, "w") as fh:
                    fh.write(json.dumps(out))
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 70
            sys.stderr.flush()
            os._exit(code)
        rep = _reap(pid, float(limit))
        rep["result"] = Path(res_path).read_text()
        rep["stderr"] = Path(err_path).read_text(errors="replace")[-20000:]
        sys.stdout.write(json.dumps(rep) + "\n")
        sys.stdout.flush()
    return 0


def _reap(pid: int, limit: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"rc": None, "signal": 0, "timeout": limit}
        time.sleep(0.005)
    if os.WIFSIGNALED(status):
        return {"rc": None, "signal": os.WTERMSIG(status), "timeout": 0}
    return {"rc": os.WEXITSTATUS(status), "signal": 0, "timeout": 0}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--serve"]:
        return _serve()
    if len(args) != 2:
        print("usage: python -m tests.decoder.kernel_cases (OP NAME | --serve)", file=sys.stderr)
        return 2
    out = run_here(find(args[0], args[1]))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
