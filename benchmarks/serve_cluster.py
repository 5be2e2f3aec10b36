"""`llmir serve` single-process against `llmir serve --ray` with 1 and 2 replicas, at 1, 8 and
32 concurrent streaming clients: aggregate throughput and time to first token P50 / P99.

The model is the test suite's tiny random llama (`--shape tiny`, default) or a SmolLM2-135M
shape (`--shape smollm2`), built under --work. Each server runs in its own process on
127.0.0.1 (the Ray ones on a local head they start) with --max-batch 8 --max-queue 64 per
replica and --threads 1; this process sends max(--requests, 2 x clients) greedy streaming
completions (distinct prompts, `--gen-len` tokens) through that many clients at once, for every
level in turn (P99 of 16 requests is their slowest).

Throughput = generated tokens / wall time from the first request to the last answer; TTFT is
per request, from sending it to its first text chunk.

On one machine the replicas share its cores: with C cores, R replicas of T threads each get
min(1, C / (R * T)) of a core per thread, and the proxy, controller and head take their share,
so 2 replicas on this 2-core machine cannot double anything; they show Ray's routing and
proxy overhead. On a cluster where each replica has its own T cores, throughput scales as
R x (one replica's throughput) until the proxy saturates; TTFT at N clients falls because each
replica batches N / R of them.

    python benchmarks/serve_cluster.py --work /tmp/llmir-cluster-bench --gen-len 64 --requests 32

Measured 2026-12-03 on the 2-core machine at load average ~1 (benchmarks/results/
serve_cluster.json, table in docs/cluster.md): single process 4800 / 11048 / 11275 tok/s at
1 / 8 / 32 clients; Ray 1 replica 2381 / 4994 / 4958; Ray 2 replicas 1944 / 4626 / 5528; TTFT
P50 at 32 clients 123 ms single, 294 ms 1 replica, 149 ms 2 replicas; greedy texts equal.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.serve_throughput import busy_seconds, one_request, prepare  # noqa: E402

LEVELS = (1, 8, 32)
SERVERS = (
    ("single", ()),
    ("ray-1", ("--ray", "--replicas", "1")),
    ("ray-2", ("--ray", "--replicas", "2")),
)


def start(art: Path, extra: tuple[str, ...], log: Any) -> tuple[subprocess.Popen[str], int]:
    """`llmir serve ART EXTRA` on a free port; (process, port) once /health answers."""
    from llmir_core.serve.cluster import free_port

    port = free_port("127.0.0.1")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "llmir_cli.app", "serve", str(art), "--port", str(port)]
    cmd += ["--max-batch", "8", "--max-queue", "64", "--threads", "1", *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True).start()
    deadline = time.monotonic() + 300
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("server did not start:\n" + "".join(lines))
        time.sleep(0.5)
    log(f"  started {' '.join(extra) or 'single-process'} on port {port}")
    return proc, port


def level(port: int, model: str, prompts: list[str], gen_len: int, clients: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    it = iter(prompts)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            r = one_request(port, model, p, gen_len)
            with lock:
                out.append(r)

    busy0, t0 = busy_seconds(), time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in out if r["ttft"] is not None)
    tokens = sum(r["tokens"] for r in out)
    return {
        "clients": clients,
        "requests": len(out),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1),
        "ttft_p99_ms": round(1000 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 1),
        "cpu_busy_s": round(busy_seconds() - busy0, 1),
        "texts": {r["text"] for r in out},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-cluster-bench"))
    ap.add_argument("--shape", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument(
        "--requests", type=int, default=16, help="requests per level: max(this, 2 x clients)"
    )
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/serve_cluster.json")
    a = ap.parse_args()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    a.work.mkdir(parents=True, exist_ok=True)
    art = prepare(a.work, a.shape, log)
    model = art.name
    prompts = [f"Request {i}: once upon a time" for i in range(max(a.requests, 2 * max(LEVELS)))]
    rows: list[dict[str, Any]] = []
    for name, extra in SERVERS:
        proc, port = start(art, extra, log)
        try:
            one_request(port, model, "warm up", 4)
            for clients in LEVELS:
                n = max(a.requests, 2 * clients)
                r = level(port, model, prompts[:n], a.gen_len, clients)
                rows.append({"server": name, **r})
                log(
                    f"  {name:7} {clients:3} clients: {r['tokens_per_s']:8.1f} tok/s, "
                    f"TTFT P50 {r['ttft_p50_ms']:7.1f} ms P99 {r['ttft_p99_ms']:7.1f} ms"
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    base = {r["clients"]: r["texts"] for r in rows if r["server"] == "single"}
    same = all(r["texts"] == base[r["clients"]] for r in rows)
    for r in rows:
        del r["texts"]
    print(f"{'server':8} {'clients':>7} {'tok/s':>8} {'TTFT P50 ms':>12} {'TTFT P99 ms':>12}")
    for r in rows:
        print(
            f"{r['server']:8} {r['clients']:7} {r['tokens_per_s']:8.1f} "
            f"{r['ttft_p50_ms']:12.1f} {r['ttft_p99_ms']:12.1f}"
        )
    print(f"greedy texts equal across servers: {same}")
    with open("/proc/loadavg", encoding="ascii") as fh:
        load = fh.read().split()[:3]
    result = {
        "shape": a.shape,
        "requests": a.requests,
        "gen_len": a.gen_len,
        "cores": os.cpu_count(),
        "loadavg_after": load,
        "texts_equal": same,
        "rows": rows,
    }
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
