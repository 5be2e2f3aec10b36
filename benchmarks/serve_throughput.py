"""Aggregate generation throughput of `llmir serve` at 1, 4 and 16 concurrent clients.

The model is a random-weight Hugging Face folder (`--shape smollm2`: SmolLM2-135M-shaped, the
default; `--shape tiny`: the test suite's), imported and built with llmir's decoder build under
--work. One `llmir serve` process (--max-batch 16) serves it on 127.0.0.1; this process sends the
same `--requests` streaming completion requests (distinct prompts of about `--prompt-len`
tokens, `--gen-len` new tokens each, greedy) through 1, 4 and 16 concurrent clients:

- `sequential`: one client, one request after the other (what serving without batching does);
- `concurrent-4`, `concurrent-16`: that many clients at once; the server decodes all admitted
  sequences in one batched forward per step (continuous batching).

Aggregate tokens/s = generated tokens / wall time from the first request to the last answer.
Also per level: median time to first token and median inter-token gap seen by the clients. The
levels are interleaved over --rounds rounds (order rotated) and medians reported, because the
other processes on this machine change its speed from minute to minute; the CPU time others used
during the run is printed (from /proc/stat). Every concurrent answer is checked against the
sequential one (greedy: batching must not change the text).

    python benchmarks/serve_throughput.py --work /tmp/llmir-serve-bench --rounds 2

Measured 2026-12-01 on the shared 2-core machine with a load average of 12-15 (other jobs kept
both cores busy all along: absolute numbers are 5-10x below an idle machine, ratios are what
the run shows), SmolLM2-135M shape, f32, 16 requests x 32 tokens, server threads auto (1):

- `--prompt-len 8 --rounds 1` (last-position logits build): sequential 1.9 tok/s, 4 clients
  6.7 (3.6x), 16 clients 13.4 (7.3x); one batched forward alone: batch 4 3.3x, batch 16 7.2x
  the tokens/s of batch 1; the largest decode batch was 16; greedy texts equal sequential.
- `--prompt-len 32 --rounds 2` (all-position logits build, prompts of ~36 tokens, so prefill is
  half the work and batching does not shorten it): sequential 2.7 tok/s, 4 clients 5.2 (2.0x),
  16 clients 6.0 (2.3x).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LEVELS = (1, 4, 16)


def prepare(work: Path, shape: str, log: Any) -> Path:
    sys.path.insert(0, str(REPO))
    from llmir_core.frontends.hf import import_hf
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder
    from tests.decoder.tiny import SMOLLM2_135M, TINY, make_llama_folder

    hf = work / f"{shape}-random"
    art = work / f"{shape}.last-logits.build"
    if not (art / "manifest.json").is_file():
        if not (hf / "model.safetensors").is_file():
            log(f"generating the {shape} random model ...")
            make_llama_folder(hf, SMOLLM2_135M if shape == "smollm2" else TINY)
        log("importing and building ...")
        build_decoder(
            import_hf(hf), str(art), max_len=512 if shape == "smollm2" else None, last_logits=True
        )
    return art


def busy_seconds() -> float:
    with open("/proc/stat", encoding="ascii") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    return (sum(parts) - parts[3] - parts[4]) / os.sysconf("SC_CLK_TCK")


def one_request(port: int, model: str, prompt: str, gen_len: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": gen_len,
        "temperature": 0,
        "stream": True,
    }
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    times, text, tokens = [], [], 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev["choices"] and ev["choices"][0]["text"]:
            times.append(time.perf_counter())
            text.append(ev["choices"][0]["text"])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    conn.close()
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {
        "text": "".join(text),
        "tokens": tokens,
        "ttft": times[0] - t0 if times else None,
        "gaps": gaps,
    }


def run_level(
    port: int, model: str, prompts: list[str], gen_len: int, clients: int
) -> dict[str, Any]:
    results: list[dict[str, Any] | None] = [None] * len(prompts)
    next_i = iter(range(len(prompts)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(next_i, None)
            if i is None:
                return
            results[i] = one_request(port, model, prompts[i], gen_len)

    busy0, t0 = busy_seconds(), time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    busy = busy_seconds() - busy0
    done = [r for r in results if r is not None]
    tokens = sum(r["tokens"] for r in done)
    gaps = [g for r in done for g in r["gaps"]]
    return {
        "clients": clients,
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "ttft_p50_s": statistics.median(r["ttft"] for r in done if r["ttft"] is not None),
        "itl_p50_s": statistics.median(gaps) if gaps else None,
        "cpu_busy_cores": busy / wall,
        "texts": [r["text"] for r in done],
    }


def forward_steps(art: Path, threads: int | None, steps: int = 6) -> dict[int, float]:
    """Median seconds of one batched decode forward at each level, no server (interleaved)."""
    from llmir_core.runtime.batch_decoder import OrtBatchDecoder

    dec = OrtBatchDecoder(str(art), max(LEVELS), threads=threads)
    for s in range(max(LEVELS)):
        dec.prefill(s, [1, 2, 3, 4, 5, 6, 7, 8], 0)
    times: dict[int, list[float]] = {n: [] for n in LEVELS}
    for k in range(steps):
        for n in LEVELS:
            t0 = time.perf_counter()
            dec.decode(list(range(n)), [5] * n, [8 + k] * n)
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(ts) for n, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-serve-bench"))
    ap.add_argument("--shape", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument(
        "--prompt-len", type=int, default=32, help="prompt characters (about that many tokens)"
    )
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--threads", type=int, default=None, help="server intra-op threads (default: auto)"
    )
    ap.add_argument("--json", type=Path, default=None, help="write all runs here")
    args = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    args.work.mkdir(parents=True, exist_ok=True)
    art = prepare(args.work, args.shape, log)
    cmd = [
        sys.executable,
        "-m",
        "llmir_cli.app",
        "serve",
        str(art),
        "--port",
        "0",
        "--max-batch",
        "16",
        "--max-queue",
        "64",
    ]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        m = re.search(r"serving (\S+) on http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            raise SystemExit(f"the server did not start: {line}{server.stderr.read()}")
        model, port = m.group(1), int(m.group(2))
        for _ in range(600):
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/health")
                break
            except OSError:
                time.sleep(0.1)
        words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()
        prompts = [
            " ".join(words[(i + k) % len(words)] for k in range(40))[: args.prompt_len] + f" #{i}"
            for i in range(args.requests)
        ]
        one_request(port, model, prompts[0], 4)  # warm-up
        runs: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = LEVELS[r % len(LEVELS) :] + LEVELS[: r % len(LEVELS)]
            for c in order:
                res = run_level(port, model, prompts, args.gen_len, c)
                res["round"] = r
                runs.append(res)
                log(
                    f"round {r} clients {c:2d}: {res['tokens_per_s']:7.1f} tok/s  wall {res['wall_s']:.2f} s  "
                    f"others+server busy {res['cpu_busy_cores']:.2f} cores"
                )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
    finally:
        server.terminate()
        server.wait(60)
    log("timing the batched decode forward alone ...")
    fwd = forward_steps(art, args.threads)
    seq_texts = next(x["texts"] for x in runs if x["clients"] == 1)
    mismatched = sum(1 for x in runs for a, b in zip(x["texts"], seq_texts) if a != b)
    print(
        f"model {args.shape} ({model}), {args.requests} requests x {args.gen_len} tokens, greedy, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'clients':>8} {'tok/s (median)':>15} {'vs sequential':>14} {'TTFT p50 ms':>12} {'ITL p50 ms':>11}"
    )
    base = statistics.median(x["tokens_per_s"] for x in runs if x["clients"] == 1)
    for c in LEVELS:
        xs = [x for x in runs if x["clients"] == c]
        tps = statistics.median(x["tokens_per_s"] for x in xs)
        ttft = statistics.median(x["ttft_p50_s"] for x in xs) * 1000
        itl = statistics.median(x["itl_p50_s"] or 0 for x in xs) * 1000
        label = "1 (seq)" if c == 1 else str(c)
        print(f"{label:>8} {tps:15.1f} {tps / base:13.2f}x {ttft:12.1f} {itl:11.1f}")
    print(
        "one batched decode forward, no server: "
        + ", ".join(
            f"batch {n}: {fwd[n] * 1000:.2f} ms ({n / fwd[n]:.1f} tok/s, {n / fwd[n] / (1 / fwd[1]):.2f}x)"
            for n in LEVELS
        )
    )
    print(
        f"greedy texts differing from sequential: {mismatched}; largest decode batch: "
        f"{health.get('max_batch_seen')} of {health.get('slots')} slots"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"runs": [{k: v for k, v in x.items() if k != "texts"} for x in runs]}, indent=2
            )
        )


if __name__ == "__main__":
    main()
