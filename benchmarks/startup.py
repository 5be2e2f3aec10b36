"""How fast `llmir` starts: `--version`, `--help`, and each command up to the start of its own work.

    python benchmarks/startup.py [--repeat 7] [--json]

Each line is the median wall time of --repeat fresh processes (the first run of each, which may
read cold files, is dropped). `CMD --help` imports the command's module and builds its options:
everything that happens before the command's own work starts. `python -c pass` is the
interpreter's floor on this machine right now; the load average is printed because another busy
process slows every wall time here several times over; the CPU column (user + system time of
the process) is less affected: compare it with the floor, or rerun when the machine is quiet.
Targets: `--version` and `--help` under 0.2 s, every command under 0.4 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"--version": 0.2, "--help": 0.2}
COMMAND_TARGET = 0.4


def _llmir() -> list[str]:
    script = Path(sys.executable).with_name("llmir")
    if script.is_file():
        return [str(script)]
    found = shutil.which("llmir")
    return [found] if found else [sys.executable, "-m", "llmir_cli.app"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _time(argv: list[str], repeat: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of `repeat` runs after one unmeasured run."""
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    wall, cpu = [], []
    for _ in range(repeat + 1):
        t0, c0 = time.perf_counter(), _cpu()
        subprocess.run(
            argv,
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        wall.append(time.perf_counter() - t0)
        cpu.append(_cpu() - c0)
    return statistics.median(wall[1:]), statistics.median(cpu[1:])


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from llmir_cli.app import COMMANDS

    llmir = _llmir()
    rows: list[tuple[str, tuple[float, float], float | None]] = [
        ("python -c pass", _time([sys.executable, "-c", "pass"], args.repeat), None)
    ]
    for flag, target in TARGETS.items():
        rows.append((f"llmir {flag}", _time([*llmir, flag], args.repeat), target))
    for name in COMMANDS:
        rows.append(
            (f"llmir {name} --help", _time([*llmir, name, "--help"], args.repeat), COMMAND_TARGET)
        )
    rows.append(
        (
            "llmir verify missing.llmir",
            _time([*llmir, "verify", "missing.llmir"], args.repeat),
            COMMAND_TARGET,
        )
    )
    load = os.getloadavg()[0]
    if args.json:
        print(
            json.dumps(
                {
                    "load_average_1m": load,
                    "cpus": os.cpu_count(),
                    "repeat": args.repeat,
                    "results": [
                        {
                            "what": w,
                            "seconds": round(s[0], 4),
                            "cpu_seconds": round(s[1], 4),
                            "target": t,
                        }
                        for w, s, t in rows
                    ],
                },
                indent=2,
            )
        )
        return 0
    print(f"load average {load:.2f} on {os.cpu_count()} CPUs; median of {args.repeat} runs")
    print(f"  {'':32s} {'wall':>7s}     {'CPU':>7s}")
    for what, (sec, cpu), target in rows:
        verdict = "" if target is None else ("ok" if sec < target else f"over {target:.1f} s")
        print(f"  {what:32s} {sec * 1000:7.0f} ms  {cpu * 1000:7.0f} ms  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
