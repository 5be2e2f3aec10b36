"""What a batched decode step costs against a one-row step, per kernel variant.

Builds the GGUF (`llmir import` + `llmir build`, into --work, reused) and times one decode step
of `llmir serve`'s batched runner at 1, 2, 4, 8 and 16 rows (every row a sequence at position
~--past, greedy tokens fed back), under llmir's AVX-512 VNNI kernels (where the CPU has them) and
under the AVX2 fallback (`LLMIR_KERNEL_ISA=avx2`), each variant in its own process, the variants
interleaved over --rounds rounds; medians. Prints ms per step, the ratio to one row and the
aggregate tokens/s (rows / step time), and writes them to --json.

    python benchmarks/batch_decode.py --gguf gemma-3-270m-q4_k_m.gguf \\
        --json benchmarks/results/batch_decode_gemma.json

Issue 27's target: an 8-row step costs at most 2.5x a 1-row step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ROWS = (1, 2, 4, 8, 16)
VARIANTS = ("auto", "avx2")


def measure(art: str, threads: int, past: int, steps: int) -> dict[str, Any]:
    """In this process: ms per decode step at each row count, and the kernel variants."""
    from llmir_core.targets import open_batch_artifact

    dec = open_batch_artifact(art, max(ROWS), threads=threads, max_context=past + steps + 8)
    prompt = list(range(100, 100 + past))
    for slot in range(max(ROWS)):
        dec.prefill(slot, [2, *prompt[slot:]][:past], 0)
    out: dict[str, float] = {}
    for rows in ROWS:
        slots = list(range(rows))
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            dec.decode(slots, [5 + i] * rows, [past + i] * rows)
            times.append(time.perf_counter() - t0)
        out[str(rows)] = statistics.median(times[2:]) * 1e3
    kernels = getattr(dec, "kernel_variants", lambda: {})()
    return {"ms": out, "kernels": kernels}


def run_variant(art: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "LLMIR_KERNEL_ISA": variant, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, "--child", art, "--threads", str(args.threads)]
    cmd += ["--past", str(args.past), "--steps", str(args.steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"batch_decode: the {variant} run failed: {proc.stderr.strip()[-400:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def build(gguf: Path, work: Path) -> str:
    art = work / "art"
    if (art / "manifest.json").is_file():
        return str(art)
    work.mkdir(parents=True, exist_ok=True)
    llmir = [sys.executable, "-m", "llmir_cli.app"]
    for cmd in (
        [*llmir, "import", str(gguf), "-o", str(work / "m.llmir")],
        [*llmir, "build", str(work / "m.llmir"), "-o", str(art)],
    ):
        print("+", " ".join(cmd[2:]), file=sys.stderr)
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return str(art)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of one variant: ms per step, ratio to one row, aggregate tok/s."""
    ms = {r: statistics.median(run["ms"][r] for run in runs) for r in runs[0]["ms"]}
    return {
        "ms_per_step": {r: round(v, 2) for r, v in ms.items()},
        "ratio_to_one_row": {r: round(v / ms["1"], 2) for r, v in ms.items()},
        "aggregate_tokens_per_s": {r: round(int(r) * 1e3 / v, 1) for r, v in ms.items()},
        "kernels": runs[-1]["kernels"],
    }


def render(results: dict[str, dict[str, Any]]) -> str:
    lines = ["variant        rows:  " + "  ".join(f"{r:>14}" for r in ROWS)]
    for name, res in results.items():
        cells = [
            f"{res['ms_per_step'][str(r)]:6.1f}ms {res['ratio_to_one_row'][str(r)]:4.2f}x"
            for r in ROWS
        ]
        lines.append(f"{name:21s}" + "  ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-batch-decode"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--past", type=int, default=32, help="prompt tokens per row before timing")
    ap.add_argument("--steps", type=int, default=12, help="decode steps timed per row count")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.threads, args.past, args.steps)))
        return
    if args.gguf is None or not args.gguf.is_file():
        sys.exit("batch_decode: --gguf FILE is required (a GGUF file that exists)")
    art = build(args.gguf, args.work)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for i in range(args.rounds):
        for v in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            runs[v].append(run_variant(art, v, args))
    results = {v: summarize(rs) for v, rs in runs.items()}
    print(render(results))
    if args.json:
        body = {
            "gguf": args.gguf.name,
            "threads": args.threads,
            "past": args.past,
            "rounds": args.rounds,
            "date": time.strftime("%Y-%m-%d"),
            "load_average": os.getloadavg()[0],
            "results": results,
        }
        args.json.write_text(json.dumps(body, indent=1) + "\n")


if __name__ == "__main__":
    main()
