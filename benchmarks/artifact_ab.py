"""Interleaved decode/prefill A/B of two decoder artifacts of the same model (e.g. built by two
llmir versions): blocks of decode steps alternate between A and B in one process, so a busy
machine slows both alike and the ratio survives. Prints medians and the ratio B/A.

    python benchmarks/artifact_ab.py A_DIR B_DIR --prompt-len 64 --gen-len 32 --rounds 5 --threads 1

--cpu (with --threads 1: onnxruntime then runs in the calling thread) times the thread's CPU time
instead of wall time: time other processes hold the core does not count, waits for memory do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from llmir_core.targets import open_artifact

    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu", action="store_true", help="thread CPU time (needs --threads 1)")
    a = ap.parse_args()
    if a.cpu and a.threads != 1:
        ap.error("--cpu needs --threads 1")
    clock = time.thread_time if a.cpu else time.perf_counter
    decs = {k: open_artifact(p, threads=a.threads) for k, p in (("A", a.a), ("B", a.b))}
    prompt = np.random.default_rng(0).integers(3, 1000, (1, a.prompt_len))
    res: dict[str, dict[str, list[float]]] = {k: {"prefill": [], "decode": []} for k in decs}
    for r in range(a.rounds):
        for k in ("A", "B") if r % 2 == 0 else ("B", "A"):
            d = decs[k]
            d.reserve(a.prompt_len + a.gen_len + 1)
            d.reset(1)
            t0 = clock()
            logits = d.forward(prompt)
            t1 = clock()
            tok = int(np.argmax(logits[0, -1]))
            for _ in range(a.gen_len):
                tok = int(np.argmax(d.forward(np.array([[tok]]))[0, -1]))
            t2 = clock()
            res[k]["prefill"].append(1000 * (t1 - t0))
            res[k]["decode"].append(a.gen_len / (t2 - t1))
    for k in decs:
        print(
            f"{k}: prefill {statistics.median(res[k]['prefill']):.1f} ms, "
            f"decode {statistics.median(res[k]['decode']):.1f} tok/s"
        )
    print(
        f"B/A decode {statistics.median(res['B']['decode']) / statistics.median(res['A']['decode']):.3f}, "
        f"prefill time {statistics.median(res['B']['prefill']) / statistics.median(res['A']['prefill']):.3f}"
    )


if __name__ == "__main__":
    main()
