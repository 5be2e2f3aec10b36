"""`llmir serve` against llama.cpp's `llama-server` under load, on the same GGUF file.

    python benchmarks/serve_load.py --gguf MODEL.gguf [--levels 1,4,8,16] [--rounds 2]

Both servers serve MODEL.gguf: llmir through `llmir import` + `llmir build` into --work (kept
there: a later run reuses it) and `llmir serve ART --max-batch B --threads T`; llama.cpp through
`llama-server -m MODEL.gguf -np B -t T`. The server is taken from --llama-server, else from PATH,
else from the cache folder, where it is built on first use from the llama.cpp source that the
llama-cpp-python sdist vendors (pip download + cmake: about 10 minutes on 2 cores; needs cmake
and a C++ compiler; --build-llama-server only builds it).

At each level of --levels, that many clients send streaming `/v1/completions` requests (one after
the other per client) until --requests requests are answered (default: 16, or twice the level).
Every request is greedy, asks for --tokens new tokens, and has its own prompt (random words,
--seed); both servers get the same prompts. llama-server is asked `ignore_eos: true` and
`cache_prompt: false` (no reuse of an earlier request's KV: llmir has no prompt cache). `llmir
serve` has no way to ignore end-of-sequence, so a llmir request may end early: tokens are counted
as the servers report them (the final chunk's `usage.completion_tokens`, else one per text
chunk), every rate below is on that basis, and the table shows tokens per request per server.

Per level and server:
- aggregate tok/s: generated tokens / wall time from the first request sent to the last answer;
- per-request tok/s: a request's tokens after its first / time from its first to last token
  (the streaming rate a client sees), median over requests;
- TTFT p50/p99: time from sending a request to its first text chunk (p99 interpolated linearly;
  with 16 requests it is close to the slowest);
- errors: failed requests (connection errors, HTTP errors, an error event in the stream);
  HTTP 429 (the queue is full) is counted apart, in `429`.
Ratios are llmir / llama-server (throughput: higher is better for llmir; TTFT: lower is).

Only one server runs at a time: both are started once, and the one not measured is stopped with
SIGSTOP (so it uses no CPU) while the other serves; the order alternates per level and round.
Each value is the median over --rounds. The machine may be shared: the load average and the CPU
time that other processes used during each measurement (from /proc/stat, minus the server's and
this process's own) are printed with the table; more than half a core is flagged.
llama.cpp's threads spin while they wait for work (`--poll 50`): where other processes use the
same cores they lose most of their speed, far more than llmir's; `--llama-args "--poll 0"` makes
them sleep instead.

Exit codes: 0 done; 1 a server failed to start or to build; 2 bad arguments, or no llama-server
and no way to build one (the message says what to install).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llmir"
LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp we build
SERVERS = ("llmir", "llama-server")
BUSY_CORES = 0.5  # other processes' CPU use during a measurement above which it is flagged
WORDS = (
    "river mountain quiet letter garden window silver morning story engine market winter "
    "yellow bridge candle forest doctor planet music paper ocean stone travel kitchen summer "
    "village lesson animal circle number machine picture island thunder library orange dream "
    "castle pocket violin desert harbor ladder blanket rocket mirror shadow meadow lantern"
).split()


class Fail(Exception):
    """A one-line error for the user, with its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- pure parts: stream parsing, statistics, the table (tests/serve/test_serve_load_bench.py) --


@dataclass
class Answer:
    """One request as the client saw it (times in seconds, perf_counter)."""

    sent: float
    status: int = 0  # HTTP status; 0 when no response came
    first: float | None = None  # first chunk carrying text
    last: float | None = None  # last chunk carrying text
    chunks: int = 0  # chunks carrying text
    usage_tokens: int | None = None  # the server's count (usage.completion_tokens)
    prompt_tokens: int | None = None
    finish: str | None = None
    error: str | None = None
    done: bool = False  # `data: [DONE]` seen

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.done


def read_stream(answer: Answer, lines: Iterable[tuple[float, bytes]]) -> Answer:
    """Fill answer from a completion stream's server-sent events, each line with the time it
    arrived. Both servers send OpenAI's format: `data: {json}` lines with `choices[0].text`, a
    last chunk with `finish_reason` and `usage`, then `data: [DONE]`; an `error` object in an
    event (either server's way of failing mid-stream) marks the answer failed."""
    for t, raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators, `event:` or comment lines
        data = line[5:].strip()
        if data == "[DONE]":
            answer.done = True
            break
        try:
            ev = json.loads(data)
        except json.JSONDecodeError:
            answer.error = f"bad event: {data[:80]}"
            break
        if "error" in ev:
            err = ev["error"]
            answer.error = str(err.get("message", err) if isinstance(err, dict) else err)[:200]
            break
        choice = (ev.get("choices") or [{}])[0]
        if choice.get("text"):
            answer.chunks += 1
            answer.first = t if answer.first is None else answer.first
            answer.last = t
        answer.finish = choice.get("finish_reason") or answer.finish
        usage = ev.get("usage")
        if usage:
            answer.usage_tokens = usage.get("completion_tokens")
            answer.prompt_tokens = usage.get("prompt_tokens")
    if not answer.done and answer.error is None:
        answer.error = "the stream ended without [DONE]"
    return answer


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of xs, interpolated linearly between order statistics (numpy's
    default method); nan for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class LevelStats:
    requests: int
    ok: int
    errors: int
    rejected: int  # HTTP 429
    tokens: int
    wall_s: float
    tok_s: float  # aggregate
    req_tok_s: float  # per request, median
    ttft_p50_s: float
    ttft_p99_s: float
    tokens_per_req: float
    prompt_tokens: float  # mean prompt length the server reported
    others_cores: float = math.nan  # CPU other processes used during the level
    error_samples: list[str] = field(default_factory=list)


def summarize(answers: Sequence[Answer], wall_s: float) -> LevelStats:
    ok = [a for a in answers if a.ok]
    rejected = sum(1 for a in answers if a.status == 429)
    failed = [a for a in answers if not a.ok and a.status != 429]
    tokens = sum(a.tokens for a in ok)
    ttft = [a.first - a.sent for a in ok if a.first is not None]
    rates = [
        (a.tokens - 1) / (a.last - a.first)
        for a in ok
        if a.first is not None and a.last is not None and a.last > a.first and a.tokens > 1
    ]
    prompts = [a.prompt_tokens for a in ok if a.prompt_tokens is not None]
    return LevelStats(
        requests=len(answers),
        ok=len(ok),
        errors=len(failed),
        rejected=rejected,
        tokens=tokens,
        wall_s=wall_s,
        tok_s=tokens / wall_s if wall_s > 0 else math.nan,
        req_tok_s=statistics.median(rates) if rates else math.nan,
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        tokens_per_req=tokens / len(ok) if ok else math.nan,
        prompt_tokens=statistics.fmean(prompts) if prompts else math.nan,
        error_samples=sorted({a.error or f"HTTP {a.status}" for a in failed})[:3],
    )


def median_stats(runs: Sequence[LevelStats]) -> LevelStats:
    """Each field's median over rounds (counts of errors and 429s: the sum)."""
    med = {
        k: statistics.median(getattr(r, k) for r in runs)
        for k in asdict(runs[0])
        if k not in ("errors", "rejected", "requests", "error_samples")
    }
    return LevelStats(
        requests=sum(r.requests for r in runs),
        errors=sum(r.errors for r in runs),
        rejected=sum(r.rejected for r in runs),
        error_samples=sorted({e for r in runs for e in r.error_samples})[:3],
        **med,
    )


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


COLUMNS = (  # header, field, format of one value
    ("agg tok/s", "tok_s", "{:.1f}"),
    ("req tok/s", "req_tok_s", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50_s", "ms"),
    ("TTFT p99 ms", "ttft_p99_s", "ms"),
    ("tok/req", "tokens_per_req", "{:.1f}"),
)


def _cell(v: float, fmt: str) -> str:
    if math.isnan(v):
        return "-"
    return f"{v * 1000:.0f}" if fmt == "ms" else fmt.format(v)


def render_table(table: dict[int, dict[str, LevelStats]]) -> str:
    """One block per level: a row per server, then llmir / llama-server."""
    head = f"{'clients':>7}  {'server':<12}" + "".join(f"{h:>12}" for h, _, _ in COLUMNS)
    head += f"{'errors':>7}{'429':>5}{'others':>7}"
    out = [head]
    for level in sorted(table):
        row = table[level]
        for name in SERVERS:
            if name not in row:
                continue
            s = row[name]
            cells = "".join(f"{_cell(getattr(s, f), fmt):>12}" for _, f, fmt in COLUMNS)
            busy = "-" if math.isnan(s.others_cores) else f"{s.others_cores:.2f}"
            flag = "!" if s.others_cores > BUSY_CORES else ""
            out.append(f"{level:>7}  {name:<12}{cells}{s.errors:>7}{s.rejected:>5}{busy + flag:>7}")
        if all(n in row for n in SERVERS):
            a, b = row["llmir"], row["llama-server"]
            cells = "".join(
                f"{_cell(ratio(getattr(a, f), getattr(b, f)), '{:.2f}x'):>12}"
                for _, f, _ in COLUMNS[:4]
            )
            out.append(f"{level:>7}  {'llmir/llama':<12}{cells}")
    return "\n".join(out)


def make_prompts(n: int, seed: int, words: int = 24) -> list[str]:
    """n distinct prompts of `words` random words (the same for a given seed)."""
    rng = random.Random(seed)
    return [f"Story {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


# -- the machine ---------------------------------------------------------------------------------


def busy_seconds() -> float:
    """CPU seconds all processes have used (not idle, not iowait), from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    return (sum(parts) - parts[3] - parts[4]) / os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process pid has used."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- llama-server: found or built ------------------------------------------------------------------


def _run_step(cmd: list[str], cwd: Path | None = None) -> None:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, cwd=cwd)
    if r.returncode != 0:
        raise Fail(f"building llama-server failed at: {' '.join(cmd[:3])} (exit {r.returncode})")


def build_llama_server(cache: Path, jobs: int) -> Path:
    """Build llama.cpp's server from the source vendored in the llama-cpp-python sdist, under
    cache; return the binary (kept: later runs find it there)."""
    binary = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/build/bin/llama-server"
    if binary.is_file():
        return binary
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise Fail(
                f"building llama-server needs {tool}, which is not installed: install it "
                "(e.g. `apt-get install cmake g++`) or pass --llama-server PATH",
                2,
            )
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    print(f"building llama-server under {cache} (about 10 minutes on 2 cores)", file=sys.stderr)
    if not sdist.is_file():
        _run_step(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
            + [f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(cache)]
        )
    src = binary.parents[2]
    if not src.is_dir():
        print(f"+ extracting {sdist.name}", file=sys.stderr)
        with tarfile.open(sdist) as tar:
            tar.extractall(cache, filter="data")
    _run_step(
        ["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]
        + ["-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"],
        cwd=src,
    )
    _run_step(["cmake", "--build", "build", "--target", "llama-server", "-j", str(jobs)], cwd=src)
    if not binary.is_file():
        raise Fail(f"the build ended without {binary}")
    return binary


def find_llama_server(given: Path | None, cache: Path, jobs: int) -> Path:
    if given is not None:
        if not given.is_file():
            raise Fail(f"--llama-server {given}: no such file", 2)
        return given
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else build_llama_server(cache, jobs)


# -- llmir: the artifact -------------------------------------------------------------------------


def llmir_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmir_cli.app", *args]


def llmir_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}


def build_artifact(gguf: Path, work: Path) -> Path:
    """`llmir import` + `llmir build` gguf into work (reused while the GGUF is unchanged)."""
    st = gguf.stat()
    folder = work / f"{gguf.stem}-{st.st_size}-{int(st.st_mtime)}"
    art = folder / "art"
    if (art / "manifest.json").is_file():
        return art
    folder.mkdir(parents=True, exist_ok=True)
    for cmd in (
        llmir_cmd("import", str(gguf), "-o", str(folder / "model.llmir")),
        llmir_cmd("build", str(folder / "model.llmir"), "-o", str(art)),
    ):
        print("+ llmir " + " ".join(cmd[3:]), file=sys.stderr, flush=True)
        if subprocess.run(cmd, env=llmir_env()).returncode != 0:
            raise Fail(f"`llmir {cmd[3]}` failed on {gguf}")
    return art


# -- the servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    cmd: list[str]
    port: int
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 600) -> None:
        print(f"+ {' '.join(self.cmd)}", file=sys.stderr, flush=True)
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                self.cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env
            )
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:]
                raise Fail(f"{self.name} exited {self.proc.returncode} at start: {tail}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise Fail(f"{self.name} did not answer /health within {timeout:.0f} s (log: {self.log})")

    def pause(self, on: bool) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP if on else signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def servers(args: argparse.Namespace, art: Path | None, llama: Path | None) -> dict[str, Server]:
    p1, p2 = free_port(), free_port()
    b, t = str(args.max_batch), str(args.threads)
    llmir = llmir_cmd("serve", str(art), "--port", str(p1), "--max-batch", b, "--threads", t)
    llmir += ["--max-context", str(args.ctx), "--model-name", "bench"]
    llama_cmd = [str(llama), "-m", str(args.gguf), "--host", "127.0.0.1", "--port", str(p2)]
    llama_cmd += ["-np", b, "-t", t, "-tb", t, "-c", str(args.ctx * args.max_batch)]
    llama_cmd += ["--alias", "bench", "--no-webui", "-cram", "0", *shlex.split(args.llama_args)]
    both = {
        "llmir": Server("llmir", llmir, p1, args.work / "llmir-serve.log", llmir_env()),
        "llama-server": Server("llama-server", llama_cmd, p2, args.work / "llama-server.log"),
    }
    return {n: s for n, s in both.items() if args.only in (None, n)}


def request(port: int, prompt: str, tokens: int) -> Answer:
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,  # llama-server; llmir ignores parameters it does not know
        "cache_prompt": False,  # llama-server: no KV reuse from an earlier request
    }
    answer = Answer(sent=time.perf_counter())
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        answer.status = resp.status
        if resp.status != 200:
            answer.error = f"HTTP {resp.status}: {resp.read()[:120]!r}"
            return answer
        read_stream(answer, ((time.perf_counter(), raw) for raw in resp))
        conn.close()
    except (OSError, http.client.HTTPException) as e:
        answer.error = f"{type(e).__name__}: {e}"[:200]
    return answer


def run_level(server: Server, prompts: list[str], tokens: int, clients: int) -> LevelStats:
    answers: list[Answer] = []
    todo = iter(prompts)
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                prompt = next(todo, None)
            if prompt is None:
                return
            a = request(server.port, prompt, tokens)
            with lock:
                answers.append(a)

    assert server.proc is not None
    busy0, mine0, own0 = busy_seconds(), process_seconds(server.proc.pid), own_seconds()
    t0 = time.perf_counter()
    pool = [threading.Thread(target=client) for _ in range(clients)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    wall = time.perf_counter() - t0
    ours = process_seconds(server.proc.pid) - mine0 + own_seconds() - own0
    stats = summarize(answers, wall)
    stats.others_cores = max(0.0, busy_seconds() - busy0 - ours) / wall
    return stats


# -- the run -------------------------------------------------------------------------------------


def measure(
    args: argparse.Namespace, srv: dict[str, Server]
) -> dict[int, dict[str, list[LevelStats]]]:
    runs: dict[int, dict[str, list[LevelStats]]] = {lv: {n: [] for n in srv} for lv in args.levels}
    for s in srv.values():
        s.start()
        request(s.port, "Hello", 4)  # warm-up
        s.pause(True)
    turn = 0
    for r in range(args.rounds):
        for level in args.levels:
            n = args.requests or max(16, 2 * level)
            prompts = make_prompts(n, args.seed + level)
            names = list(srv) if turn % 2 == 0 else list(srv)[::-1]
            turn += 1
            for name in names:
                srv[name].pause(False)
                stats = run_level(srv[name], prompts, args.tokens, level)
                srv[name].pause(True)
                runs[level][name].append(stats)
                print(
                    f"round {r} clients {level:3d} {name:<12} {stats.tok_s:7.1f} tok/s "
                    f"TTFT p99 {stats.ttft_p99_s * 1000:6.0f} ms  errors {stats.errors} "
                    f"429 {stats.rejected}  others {stats.others_cores:.2f} cores",
                    file=sys.stderr,
                    flush=True,
                )
    return runs


def conditions(args: argparse.Namespace, llama: Path | None) -> dict[str, Any]:
    version = ""
    if llama is not None:
        r = subprocess.run([str(llama), "--version"], capture_output=True, text=True)
        version = (r.stdout + r.stderr).strip()
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "?")
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gguf": str(args.gguf),
        "llmir_commit": commit.stdout.strip(),
        "llama_server": str(llama),
        "llama_server_version": version.splitlines()[-2:],
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "max_batch": args.max_batch,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "load_average": os.getloadavg(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gguf", type=Path, help="the GGUF file both servers serve")
    ap.add_argument("--levels", default="1,4,8,16", help="clients in flight, comma-separated")
    ap.add_argument("--requests", type=int, default=0, help="per level (0: max(16, 2 x level))")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    ap.add_argument("--threads", type=int, default=2, help="server threads, both servers")
    ap.add_argument("--max-batch", type=int, default=8, help="llmir --max-batch, llama-server -np")
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence, both servers")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="seeds the prompts")
    ap.add_argument("--work", type=Path, default=CACHE / "serve_load")
    ap.add_argument("--llama-server", type=Path, default=None, help="the llama-server binary")
    ap.add_argument("--llama-args", default="", help="more llama-server arguments, e.g. '--poll 0'")
    ap.add_argument("--build-llama-server", action="store_true", help="only build it, then exit")
    ap.add_argument("--jobs", type=int, default=2, help="parallel jobs for the llama.cpp build")
    ap.add_argument("--only", choices=SERVERS, default=None, help="measure one server only")
    ap.add_argument("--json", type=Path, default=None, help="write conditions and all runs here")
    args = ap.parse_args(argv)
    try:
        args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        raise Fail(f"--levels must be comma-separated integers, got {args.levels!r}", 2) from None
    if not args.levels or min(args.levels) < 1 or args.rounds < 1 or args.tokens < 2:
        raise Fail("--levels must be >= 1, --rounds >= 1 and --tokens >= 2", 2)
    if not args.build_llama_server and (args.gguf is None or not args.gguf.is_file()):
        raise Fail(f"--gguf: no such file: {args.gguf}", 2)
    return args


def report(
    args: argparse.Namespace, cond: dict[str, Any], table: dict[int, dict[str, LevelStats]]
) -> None:
    """Print the conditions, the table and what the columns mean."""
    print(
        f"{args.gguf.name}: {args.tokens} tokens a request, greedy, --threads {args.threads}, "
        f"--max-batch/-np {args.max_batch}, {args.rounds} round(s), medians; {cond['cpu']}, "
        f"{cond['cpus']} CPUs, load average {' '.join(f'{x:.1f}' for x in cond['load_average'])}"
    )
    print(render_table(table))
    print(
        "others: cores other processes kept busy during the level (! above "
        f"{BUSY_CORES}); ratios: llmir / llama-server; tok/req: tokens each request got"
    )
    for name in SERVERS:
        lens = [row[name].prompt_tokens for row in table.values() if name in row]
        if lens:
            print(f"{name}: prompts of {statistics.fmean(lens):.1f} tokens on average")
    for lv, row in table.items():
        for name, st in row.items():
            for e in st.error_samples:
                print(f"errors at {lv} clients, {name}: {e}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    llama = None
    if args.only != "llmir":
        llama = find_llama_server(args.llama_server, CACHE / "llama-server", args.jobs)
    if args.build_llama_server:
        print(llama)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    art = None if args.only == "llama-server" else build_artifact(args.gguf, args.work)
    srv = servers(args, art, llama)
    try:
        runs = measure(args, srv)
    finally:
        for s in srv.values():
            s.stop()
    table = {lv: {n: median_stats(rs) for n, rs in row.items()} for lv, row in runs.items()}
    cond = conditions(args, llama)
    report(args, cond, table)
    if args.json:
        out = {
            "conditions": cond,
            "commands": {n: s.cmd for n, s in srv.items()},
            "runs": {
                lv: {n: [asdict(x) for x in rs] for n, rs in row.items()}
                for lv, row in runs.items()
            },
            "medians": {lv: {n: asdict(s) for n, s in row.items()} for lv, row in table.items()},
        }
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.code)
    except KeyboardInterrupt:
        sys.exit(130)
