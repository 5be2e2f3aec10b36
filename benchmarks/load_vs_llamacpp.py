"""Load time and peak RSS of llmir artifacts against llama.cpp on the same weights, in one run.

Each measurement is the `bench --vs` worker (`python -m llmir_core.runtime.peers`) in a fresh
process: the libraries are imported first (not timed as load), then the model is loaded (load_s:
artifact or GGUF to a ready session), warmed up (16 prompt tokens, 8 greedy), and one timed greedy
generation runs (prompt --prompt-len, --gen-len tokens); peak RSS is the process's VmHWM at the
end, so memory-mapped weights count once they are read. Tools are interleaved run by run; a run
during which other processes kept more than 0.25 cores busy is marked busy, and the medians use
the clean runs when there are any. Ratios are llmir's value over llama.cpp's (load, RSS: lower is
better; decode: higher is better).

    python benchmarks/load_vs_llamacpp.py \\
        --case f32:MODEL.f32.gguf:llmir-f32,llmir-f32-none \\
        --case int8:MODEL.q8_0.gguf:llmir-int8 --case int4:MODEL.q4_0.gguf:llmir-int4 \\
        [--runs 3] [--threads 2] [--prompt-len 128] [--gen-len 16] [--out FILE.json]

benchmarks/vs_peers.py builds such artifacts and GGUF files (its --work folder). Needs
llama-cpp-python (`pip install 'llmir[bench]'`).
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
BUSY = 0.25  # cores other processes may use during a run before it is marked busy


def _size(path: str) -> int:
    p = Path(path)
    return (
        sum(f.stat().st_size for f in p.iterdir() if f.is_file())
        if p.is_dir()
        else p.stat().st_size
    )


def _measure(kind: str, path: str, ids: list[int], gen: int, threads: int) -> dict[str, Any]:
    cfg = {"kind": kind, "path": path, "ids": ids, "gen_len": gen, "threads": threads}
    r = subprocess.run(
        [sys.executable, "-m", "llmir_core.runtime.peers"],
        input=json.dumps(cfg),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=900,
    )
    lines = r.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {"error": r.stderr.strip()[-500:]}
    if "error" in out:
        raise SystemExit(f"{kind} {path}: {out['error']}")
    return dict(out)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    clean = [r for r in runs if r["others_cores"] <= BUSY] or runs
    vals = [r[key] for r in clean if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--case",
        action="append",
        required=True,
        help="NAME:FILE.gguf:ART[,ART...] (llmir artifacts compared with that GGUF file)",
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--out", default=None, help="write the runs and the summary as JSON")
    a = ap.parse_args()
    cases: list[tuple[str, str, list[str]]] = []
    for c in a.case:
        parts = c.split(":")
        if len(parts) != 3 or not parts[2]:
            raise SystemExit(f"--case {c!r}: expected NAME:FILE.gguf:ART[,ART...]")
        cases.append(
            (parts[0], os.path.abspath(parts[1]), [os.path.abspath(x) for x in parts[2].split(",")])
        )
    import numpy as np

    ids = [int(x) for x in np.random.default_rng(0).integers(3, 1000, a.prompt_len)]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(a.runs):
        for name, gguf, arts in cases:
            for kind, path in [("llama.cpp", gguf)] + [("llmir", x) for x in arts]:
                print(
                    f"run {r + 1}/{a.runs}: {name} {kind} {os.path.basename(path)}",
                    file=sys.stderr,
                    flush=True,
                )
                m = _measure(kind, path, ids, a.gen_len, a.threads)
                runs.setdefault((name, path), []).append(m)
    summary: dict[str, Any] = {}
    for name, gguf, arts in cases:
        ref = runs[(name, gguf)]
        lc = {k: _median(ref, k) for k in ("load_s", "peak_rss_mb", "decode_tok_s", "prefill_ms")}
        lc["bytes"] = _size(gguf)
        summary[name] = {"llama.cpp": {"path": gguf, **lc}, "llmir": {}}
        print(
            f"{name}: llama.cpp {os.path.basename(gguf)}: load {lc['load_s']:.3f} s, peak RSS "
            f"{lc['peak_rss_mb']:.0f} MB, decode {lc['decode_tok_s']:.1f} tok/s, prefill "
            f"{lc['prefill_ms']:.0f} ms, {lc['bytes'] / 1e6:.0f} MB on disk"
        )
        for art in arts:
            mine = runs[(name, art)]
            me = {
                k: _median(mine, k) for k in ("load_s", "peak_rss_mb", "decode_tok_s", "prefill_ms")
            }
            me["bytes"] = _size(art)
            man = json.loads((Path(art) / "manifest.json").read_text())
            me["prepack"] = (man.get("decoder") or {}).get("prepack", "session")
            ratios = {
                "load": me["load_s"] / lc["load_s"],
                "peak_rss": me["peak_rss_mb"] / lc["peak_rss_mb"],
                "decode": me["decode_tok_s"] / lc["decode_tok_s"],
                "prefill_speed": lc["prefill_ms"] / me["prefill_ms"],
                "disk": me["bytes"] / lc["bytes"],
            }
            me["vs_llama_cpp"] = ratios
            me["clean_runs"] = sum(1 for r in mine if r["others_cores"] <= BUSY)
            summary[name]["llmir"][art] = me
            print(
                f"{name}: llmir {os.path.basename(art)} (prepack {me['prepack']}): load "
                f"{me['load_s']:.3f} s ({ratios['load']:.2f}x llama.cpp), peak RSS "
                f"{me['peak_rss_mb']:.0f} MB ({ratios['peak_rss']:.2f}x), decode "
                f"{me['decode_tok_s']:.1f} tok/s ({ratios['decode']:.2f}x), prefill "
                f"{me['prefill_ms']:.0f} ms ({ratios['prefill_speed']:.2f}x speed), "
                f"{me['bytes'] / 1e6:.0f} MB on disk ({ratios['disk']:.2f}x), "
                f"{me['clean_runs']}/{len(mine)} clean runs"
            )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"load average at the end: {load}", file=sys.stderr)
    if a.out:
        doc = {
            "benchmark": "load_vs_llamacpp",
            "config": vars(a),
            "load_average_end": load,
            "summary": summary,
            "runs": {f"{n} {p}": rs for (n, p), rs in runs.items()},
        }
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(out)
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
