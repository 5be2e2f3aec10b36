"""The README's optimizer report, run on the tiny llama and written to benchmarks/results/.

    python benchmarks/optimize_report.py      # seconds

Writes the tiny llama of examples/make_tiny_llama.py (seeded random weights), imports it and runs
`llmir optimize tiny.llmir -O2 --verify-each --report --time-passes -o tiny.opt.llmir` in a
temporary folder, and stores the command, its stdout and exit code in
benchmarks/results/optimize_report_tiny.json (--out). README.md's "What the optimizer reports"
block is generated from that file (scripts/gen_doc_numbers.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMAND = ["optimize", "tiny.llmir", "-O2", "--verify-each", "--report", "--time-passes"]


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/optimize_report_tiny.json"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for step in (
            [str(REPO / "examples" / "make_tiny_llama.py"), "tiny-llama"],
            ["-m", "llmir_cli.app", "import", "tiny-llama", "-o", "tiny.llmir", "-q"],
        ):
            r = run(cwd, *step)
            if r.returncode:
                raise SystemExit(f"{' '.join(step)} failed:\n{r.stderr[-3000:]}")
        r = run(cwd, "-m", "llmir_cli.app", *COMMAND, "-o", "tiny.opt.llmir")
    result = {
        "benchmark": "benchmarks/optimize_report.py",
        "date": datetime.date.today().isoformat(),
        "command": "llmir " + " ".join([*COMMAND, "-o", "tiny.opt.llmir"]),
        "exit_code": r.returncode,
        "stdout": r.stdout,
    }
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
