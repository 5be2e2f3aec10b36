"""Artifact load cost: import, open (manifest check + session), first token, peak RSS, size.

Each measurement runs in a fresh process (so imports, page faults and VmHWM are the load's own);
artifacts (and, with --tree, the same artifacts opened by another llmir checkout: before/after)
are interleaved run by run. CPU seconds are reported next to wall seconds because this machine
is shared: CPU time is what the load costs, wall time what it took while others ran. With
--gguf FILE the artifact's size is compared with the GGUF file it was built from.

    python benchmarks/artifact_load.py ART [ART ...] [--gguf ART=FILE.gguf] [--tree OTHER_REPO]
        [--runs 3] [--threads 2] [--out benchmarks/results/artifact_load.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

_WORKER = r"""
import json, os, sys, time
def clock():
    return time.perf_counter(), time.process_time()
def since(t):
    w, c = clock()
    return round(w - t[0], 4), round(c - t[1], 4)
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
t = clock()
import numpy as np
import onnxruntime
from llmir_core.targets import open_artifact
imp = since(t)
t = clock()
dec = open_artifact(sys.argv[1], threads=int(sys.argv[2]))
opened = since(t)
t = clock()
dec.reserve(8)
dec.reset(1)
tok = int(dec.forward(np.array([[5]], np.int64))[0, -1].argmax())
first = since(t)
print(json.dumps({"import": imp, "open": opened, "first_token": first, "peak_rss_mb": hwm(),
                  "token": tok}))
"""


def _run(tree: Path, art: str, threads: int) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-c", _WORKER, art, str(threads)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,  # `python -c` puts the working folder first on sys.path
        timeout=600,
    )
    if r.returncode:
        raise SystemExit(f"{art} ({tree}) failed:\n{r.stderr[-2000:]}")
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _size(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--gguf", action="append", default=[], help="ART=FILE.gguf (size compared)")
    ap.add_argument("--tree", help="another llmir checkout to open the same artifacts with")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "artifact_load.json"))
    a = ap.parse_args()
    ggufs = dict(x.split("=", 1) for x in a.gguf)
    trees = {"this": REPO} | ({"other": Path(a.tree).resolve()} if a.tree else {})
    runs: dict[str, list[dict[str, Any]]] = {}
    arts = [os.path.abspath(x) for x in a.artifacts]
    ggufs = {os.path.abspath(k): v for k, v in ggufs.items()}
    for r in range(a.runs):
        for art in arts:
            for label, tree in trees.items():
                key = f"{art} [{label}]" if a.tree else art
                print(f"run {r + 1}/{a.runs}: {key}", file=sys.stderr, flush=True)
                runs.setdefault(key, []).append(_run(tree, art, a.threads))
    summary: dict[str, Any] = {}
    for key, rs in runs.items():
        art = key.split(" [")[0]
        s: dict[str, Any] = {
            f"{m}_{kind}_s": statistics.median(x[m][i] for x in rs)
            for m in ("import", "open", "first_token")
            for i, kind in enumerate(("wall", "cpu"))
        }
        s["peak_rss_mb"] = statistics.median(x["peak_rss_mb"] for x in rs)
        s["artifact_bytes"] = _size(art)
        if art in ggufs:
            s["gguf_bytes"] = os.path.getsize(ggufs[art])
            s["artifact_over_gguf"] = round(s["artifact_bytes"] / s["gguf_bytes"], 4)
        summary[key] = s
        print(f"{key}: " + ", ".join(f"{k} {v}" for k, v in s.items()))
    doc = {"benchmark": "artifact_load", "config": vars(a), "summary": summary, "runs": runs}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
