"""Fuzz every ai.llmir kernel (llmir_core/targets/onnxruntime/native) with hostile one-node cases.

Each case (tests/decoder/kernel_cases.py) runs in its own python: a one-node onnxruntime
session and a sequence of calls on it (shapes that disagree with the attributes, inputs that
shrink or grow between calls, zero-size and int64-overflowing dims, wrong dtypes, NaN/inf,
outputs bound onto inputs). A case passes when each call is refused with an onnxruntime error or
matches the numpy reference, as the case asks, and the process ends with no signal and no
sanitizer report. Exit 1 if any case failed.

    python scripts/fuzz_kernels.py                      # every case, the cached -O3 library
    python scripts/fuzz_kernels.py --asan               # against an ASan + UBSan build
    python scripts/fuzz_kernels.py --op MatMulNBitsQ4 --format json
    python scripts/fuzz_kernels.py --per-op 3           # the first 3 cases of each op
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.decoder.kernel_cases import Case, Result

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--asan", action="store_true", help="run against the ASan + UBSan library")
    p.add_argument("--op", action="append", help="only this op (repeatable); default: all")
    p.add_argument("--case", action="append", help="only cases whose name contains this")
    p.add_argument("--per-op", type=int, default=0, help="at most this many cases per op")
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--timeout", type=float, default=120, help="seconds per case (default 120)")
    p.add_argument("--format", choices=("human", "json"), default="human")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from llmir_core.targets.onnxruntime.native import (
        CustomOpError,
        library_path,
        unavailable_reason,
    )
    from tests.decoder.kernel_cases import Server, all_cases, asan_env

    cases = [
        c for c in all_cases() if not args.op or c.op in args.op or c.op.split("[")[0] in args.op
    ]
    if args.case:
        cases = [c for c in cases if any(s in c.name for s in args.case)]
    if args.per_op:
        seen: Counter[str] = Counter()
        kept = []
        for c in cases:
            seen[c.op] += 1
            if seen[c.op] <= args.per_op:
                kept.append(c)
        cases = kept
    if args.list:
        for c in cases:
            print(f"{c.op}\t{c.name}")
        return 0
    why = unavailable_reason()
    if why:
        print(f"error: llmir's kernels cannot run here: {why}", file=sys.stderr)
        return 2
    try:
        lib = library_path(sanitized=args.asan)
        env = asan_env(lib) if args.asan else {"LLMIR_FUZZ_LIB": lib}
    except (CustomOpError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("NO_COLOR", "1")
    jobs = max(1, min(args.jobs, len(cases)))
    servers: Queue[Server] = Queue()
    for _ in range(jobs):  # each forks one child per case; a worker thread holds one at a time
        servers.put(Server(env))

    def run(case: Case) -> Result:
        server = servers.get()
        try:
            return server.run(case, args.timeout)
        finally:
            servers.put(server)

    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(run, cases))
    while not servers.empty():
        servers.get().close()
    failed = [r for r in results if not r.passed]
    if args.format == "json":
        print(
            json.dumps(
                {
                    "schema_version": 1,
                    "library": lib,
                    "asan": args.asan,
                    "cases": [
                        {
                            "op": r.case.op,
                            "case": r.case.name,
                            "status": r.status,
                            "detail": r.detail,
                            "seconds": round(r.seconds, 2),
                        }
                        for r in results
                    ],
                    "summary": _summary(results),
                },
                indent=1,
            )
        )
    else:
        _table(results, args.asan)
    return 1 if failed else 0


def _summary(results: list[Result]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in results:
        row = out.setdefault(r.case.op, {"cases": 0, "pass": 0, "refused": 0, "computed": 0})
        row["cases"] += 1
        if r.passed:
            row["pass"] += 1
            calls = r.detail.split("; ")
            row["refused" if all("->error" in c for c in calls) else "computed"] += 1
        else:
            row[r.status] = row.get(r.status, 0) + 1
    return out


def _table(results: list[Result], asan: bool) -> None:
    summary = _summary(results)
    print(f"{'op':<36} {'cases':>5} {'pass':>5} {'fail':>5}  {'(refused / computed)':<22}")
    for op, row in summary.items():
        fails = row["cases"] - row["pass"]
        print(
            f"{op:<36} {row['cases']:>5} {row['pass']:>5} {fails:>5}  "
            f"{row['refused']} / {row['computed']}"
        )
    total = len(results)
    bad = [r for r in results if not r.passed]
    print(f"{total - len(bad)} of {total} cases passed" + (" (ASan + UBSan build)" if asan else ""))
    for r in bad:
        print(f"FAIL {r.case.op}/{r.case.name}: {r.status}: {r.detail}")


if __name__ == "__main__":
    sys.exit(main())
