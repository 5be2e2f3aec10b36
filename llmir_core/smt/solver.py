"""Run a solver job in a forked child process with a hard wall-clock limit.

z3's own timeout is not always honoured (nonlinear real arithmetic can run for minutes past
it), so every z3 call made by llmir runs here: the parent waits on a pipe and kills the child
when the limit passes. A killed or crashed job returns verdict `inconclusive` with the reason;
it never hangs the caller.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import time
from collections.abc import Callable
from typing import Any

DEFAULT_LIMIT_S = float(os.environ.get("LLMIR_SMT_TIMEOUT", "10"))


def _child(conn: Any, job: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    # A Ctrl-C reaches the whole process group: the parent handles it (and kills this child);
    # here it would only print multiprocessing's traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        res = job(*args)
    except MemoryError:
        res = {"verdict": "inconclusive", "reason": "solver ran out of memory"}
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        res = {"verdict": "unknown", "reason": f"{type(exc).__name__}: {exc}"}
    try:
        conn.send_bytes(pickle.dumps(res))
    except Exception as exc:  # noqa: BLE001 - unpicklable result
        conn.send_bytes(
            pickle.dumps({"verdict": "unknown", "reason": f"result not picklable: {exc}"})
        )
    conn.close()


def _warm() -> None:
    """Import z3 once in the parent so each forked child starts with it loaded."""
    import z3  # noqa: F401


def run_job(
    job: Callable[..., dict[str, Any]], *args: Any, limit_s: float | None = None
) -> dict[str, Any]:
    """Run `job(*args)` (which may import and use z3) in a child; kill it after `limit_s`."""
    limit = DEFAULT_LIMIT_S if limit_s is None else limit_s
    _warm()
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    proc = ctx.Process(target=_child, args=(child, job, args), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(limit):
            res = pickle.loads(parent.recv_bytes())
        else:
            res = {
                "verdict": "inconclusive",
                "reason": f"solver timed out after {limit:g} s (killed)",
            }
    except EOFError:
        res = {"verdict": "inconclusive", "reason": "solver process died (out of memory?)"}
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(1)
        parent.close()
    res.setdefault("seconds", time.perf_counter() - t0)
    return res
