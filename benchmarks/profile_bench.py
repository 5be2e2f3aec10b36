"""`llmir bench --profile` on a random-weight model, written to benchmarks/results/ for the docs.

Builds the model (tests/decoder/tiny.py's seeded random weights: the tiny llama, or the
SmolLM2-135M shape), imports and builds it (`llmir import` + `llmir build [--quant ...]`), then
runs `llmir bench ART --profile --format json` and writes that JSON with the command, the
machine's load average and the date:

    python benchmarks/profile_bench.py                            # tiny llama, f32: seconds
    python benchmarks/profile_bench.py --model smollm2 --quant int4

Output: benchmarks/results/profile_<model>_<precision>.json (--out). docs/perf.md's profile
section is generated from these files (scripts/gen_doc_numbers.py).

What the numbers mean: per phase, `kernel_share` is the time inside onnxruntime's kernels over
the step's wall time; `dispatch_us` is the wall time between one kernel's end and the next one's
start, charged to the op whose kernel follows, so `attributed_share` (kernels + dispatch of named
ops) is near 100% by construction and says only that every kernel maps to an op;
`unprofiled_step_us` is the same step without the profiler, whose own cost lands mostly in the
dispatch part.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def llmir(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "llmir_cli.app", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if r.returncode:
        raise SystemExit(f"llmir {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--quant", choices=("int4", "int8"), default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--profile-steps", type=int, default=16)
    ap.add_argument("--work", default=None, help="a folder to keep the model in (default: temp)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    from tests.decoder.tiny import SMOLLM2_135M, TINY, make_llama_folder

    precision = a.quant or "f32"
    out = Path(a.out or REPO / "benchmarks" / "results" / f"profile_{a.model}_{precision}.json")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        hf = work / a.model / "hf"
        if not (hf / "model.safetensors").is_file():
            make_llama_folder(hf, SMOLLM2_135M if a.model == "smollm2" else TINY, seed=0)
        mod, art = work / a.model / "model.llmir", work / a.model / f"llmir-{precision}"
        llmir("import", str(hf), "-o", str(mod), "-q")
        llmir("build", str(mod), "-o", str(art), "-q", *(["--quant", a.quant] if a.quant else []))
        args = [
            "bench",
            str(art),
            "--profile",
            "--threads",
            str(a.threads),
            "--prompt-len",
            str(a.prompt_len),
            "--profile-steps",
            str(a.profile_steps),
            "--format",
            "json",
        ]
        profile = json.loads(llmir(*args))
    result: dict[str, Any] = {
        "benchmark": "benchmarks/profile_bench.py",
        "date": datetime.date.today().isoformat(),
        "model": a.model,
        "precision": precision,
        "command": "llmir " + " ".join(["bench", "ART", *args[2:]]),
        "loadavg": os.getloadavg(),
        "profile": profile,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
