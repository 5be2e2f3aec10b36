"""How busy the CPUs are, and the thread count a CPU runtime takes from it.

Read from /proc/stat (Linux); callers fall back where it is missing. `resolve_threads` is what
a runner's `threads=None` means: DEFAULT_THREADS, else one thread per core other processes
leave free (`auto_threads`).
"""

from __future__ import annotations

import math
import os
import time

from llmir_core.errors import InputError

# Intra-op threads when none is asked for: None = `auto_threads()`. Measured on the 2-core
# machine (benchmarks/decode_vs_ortgenai.py --choices, SmolLM2-135M shape, decode): with the
# other core idle, 2 threads decode 1.35-1.4x faster than 1 (f32 and int4); with other processes
# using 1.2-1.6 cores, 1 thread is 1.4-2x faster than 2 (and thread spinning costs another
# 1.3-1.5x). So the default looks at how busy the CPUs are when the session is made.
DEFAULT_THREADS: int | None = None


def busy_cores(seconds: float) -> float:
    """CPU cores other processes kept busy over the next `seconds` (we sleep meanwhile)."""

    def busy() -> int:
        with open("/proc/stat", encoding="ascii") as fh:
            parts = [int(x) for x in fh.readline().split()[1:]]
        return sum(parts) - parts[3] - (parts[4] if len(parts) > 4 else 0)

    b0 = busy()
    time.sleep(seconds)
    return (busy() - b0) / os.sysconf("SC_CLK_TCK") / seconds


def _procs_running() -> int:
    with open("/proc/stat", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    raise ValueError("/proc/stat has no procs_running line")


def busy_now(samples: int = 24, interval_s: float = 0.0004) -> float:
    """Cores other processes keep busy now: the kernel's count of runnable threads
    (/proc/stat `procs_running`, this thread included, so one less), averaged over `samples`
    reads `interval_s` apart (~10 ms in all, where `busy_cores` sleeps through its whole window:
    opening an artifact must stay fast). A process looping on a core counts 1, one running
    half the time about 0.5. Falls back to `busy_cores` where /proc/stat has no such line."""
    try:
        total = 0
        for i in range(samples):
            if i:
                time.sleep(interval_s)
            total += _procs_running()
    except ValueError:
        return busy_cores(0.05)
    return max(0.0, total / samples - 1.0)


def auto_threads() -> int:
    """One thread per core that other processes leave free (at least 1): oversubscribed
    cores make every decode step wait for the slowest thread."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    try:
        busy = busy_now()
    except (OSError, ValueError, IndexError):  # no /proc/stat: trust the core count
        return cores
    return max(1, min(cores, cores - math.ceil(busy - 0.25)))


def resolve_threads(threads: int | None) -> int:
    """The intra-op thread count a session gets: threads, else DEFAULT_THREADS, else auto."""
    n = threads if threads is not None else DEFAULT_THREADS
    if n is None:
        return auto_threads()
    if n < 0:
        raise InputError(f"--threads must be >= 0, got {n}")
    return n


__all__ = [
    "DEFAULT_THREADS",
    "auto_threads",
    "busy_cores",
    "busy_now",
    "resolve_threads",
]
