"""16-bit builds against llama.cpp f16 and llmir's own f32 build (issue 11: "a 16-bit build that
decodes at least as fast as llama.cpp f16").

Random-weight SmolLM2-135M shape (seeded), built by llmir as f32, `--dtype f16` and
`--dtype bf16` (with llmir's custom op `ort.matmul16` where this machine builds it; the lowered
file says which), plus optionally `--dtype f16` forced onto the old f32 path
(`--target-opt cpu=x86-64`: 16-bit storage widened at load), and llama.cpp's F16 GGUF of the same
weights (tests/llm/gguf_convert.py, as benchmarks/vs_peers.py makes it). Each round runs
`llmir bench ART --vs llama.cpp:F16.gguf --runs 1` for every llmir build in turn (fresh processes,
same prompt ids, greedy), so every llmir build is measured beside the same peer moments apart;
ratios are taken within a round and the medians over rounds are printed:

    decode tok/s  build / llama.cpp f16, build / llmir f32
    prefill       llama.cpp ms / build ms, llmir f32 ms / build ms (above 1: the build is faster)
    peak RSS, load time of each build

    python benchmarks/f16_vs_peers.py                     # 3 rounds, prompt 128, generate 32
    python benchmarks/f16_vs_peers.py --rounds 5 --gen-len 128 --f32-path
    python benchmarks/f16_vs_peers.py --step-blocks 40   # one process, turns every 8 steps

`--step-blocks N` loads every build and llama.cpp in one process and lets them take turns every
8 decode steps (and a prefill every 4 turns): on a busy shared machine, where the load drifts
over seconds, that compares them under the same load better than whole runs do. With
`--threads 1` both run on the calling thread, and the decode steps' CPU time of that thread is
recorded too (`decode_cpu_ms_per_token`, `decode_cpu_vs_llama_cpp_f16`): time slices that other
processes take do not count, which on a machine loaded past its cores steadies the ratio.
Under LLMIR_KERNEL_ISA=avx2 llmir's kernels run their AVX2 variant (isa.h).

Results go to --out (default: WORK/f16_vs_peers.json). The machine's load is recorded
(/proc/loadavg before and after): on a shared machine only the ratios mean much.
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
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def llmir(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "llmir_cli.app", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    if r.returncode:
        raise SystemExit(f"llmir {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def prepare(work: Path, f32_path: bool, log: Any) -> tuple[dict[str, Path], Path]:
    from vs_peers import write_gguf

    from tests.decoder.tiny import SMOLLM2_135M, make_llama_folder

    hf = work / "hf"
    if not (hf / "model.safetensors").is_file():
        log("writing the random-weight SmolLM2-135M-shaped folder")
        make_llama_folder(hf, SMOLLM2_135M, seed=0)
    mod = work / "model.llmir"
    if not mod.is_file():
        llmir("import", str(hf), "-o", str(mod), "-q")
    builds = {"f16": ["--dtype", "f16"], "bf16": ["--dtype", "bf16"], "f32": []}
    if f32_path:
        builds["f16-f32path"] = ["--dtype", "f16", "--target-opt", "cpu=x86-64"]
    arts: dict[str, Path] = {}
    for name, flags in builds.items():
        art = work / f"llmir-{name}"
        if not (art / "manifest.json").is_file():
            log(f"llmir build {name}")
            llmir("build", str(mod), "-o", str(art), "-q", *flags)
        arts[name] = art
    gguf = work / "model.f16.gguf"
    if not gguf.is_file():
        log("writing the F16 GGUF")
        write_gguf(hf, gguf, "F16")
    return arts, gguf


def kernel_of(art: Path) -> str:
    man = json.loads((art / "manifest.json").read_text())
    return "ort.matmul16 (custom op)" if man.get("custom_ops") else "f32 matmuls"


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/llmir-f16-vs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--f32-path", action="store_true", help="also the f16 build without the op")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--step-blocks",
        type=int,
        default=0,
        help="instead: every tool in this process, taking turns every 8 decode steps, N times",
    )
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    arts, gguf = prepare(work, a.f32_path, log)
    peer = f"llama.cpp:{gguf}"
    load_before = loadavg()
    if a.step_blocks:
        res = step_interleaved(arts, gguf, a.threads, a.prompt_len, a.step_blocks, log)
        doc = {
            "benchmark": "f16_vs_peers (step-interleaved, one process)",
            "config": {k: v for k, v in vars(a).items() if k != "out"},
            "loadavg": {"before": load_before, "after": loadavg()},
            "kernels": {n: kernel_of(p) for n, p in arts.items()},
            "results": res,
        }
        print(json.dumps(doc, indent=1))
        return
    rounds: list[dict[str, Any]] = []
    t0 = time.time()
    for r in range(a.rounds):
        row: dict[str, Any] = {}
        for name, art in arts.items():
            args = [
                "bench",
                str(art),
                "--vs",
                peer,
                "--runs",
                "1",
                "--threads",
                str(a.threads),
                "--prompt-len",
                str(a.prompt_len),
                "--gen-len",
                str(a.gen_len),
                "--format",
                "json",
            ]
            vs = json.loads(llmir(*args).stdout)
            s = vs["summary"]
            lc = next(k for k in s if k.startswith("llama.cpp:"))
            row[name] = {
                "llmir": s["llmir"],
                "llama.cpp": s[lc],
                "busy": _busy(vs),
                "first_tokens_agree": s[lc].get("agrees"),
            }
            log(
                f"round {r + 1} {name}: decode {s['llmir'].get('decode_tok_s')} tok/s "
                f"(llama.cpp f16 {s[lc].get('decode_tok_s')}), prefill "
                f"{s['llmir'].get('prefill_ms')} ms (llama.cpp {s[lc].get('prefill_ms')})"
            )
        rounds.append(row)
    summary: dict[str, Any] = {}

    def ratio(name: str, den: str, metric: str, inverse: bool = False) -> float | None:
        """Build name's metric over den's (llama.cpp beside it, or llmir f32 in the round)."""
        out = []
        for row in rounds:
            x = row[name]["llmir"].get(metric)
            y = (row["f32"]["llmir"] if den == "f32" else row[name][den]).get(metric)
            if x and y:
                out.append(y / x if inverse else x / y)
        return med(out)

    for name in arts:
        summary[name] = {
            "kernel": kernel_of(arts[name]),
            "decode_tok_s": med([row[name]["llmir"].get("decode_tok_s") for row in rounds]),
            "decode_vs_llama_cpp_f16": ratio(name, "llama.cpp", "decode_tok_s"),
            "decode_vs_llmir_f32": ratio(name, "f32", "decode_tok_s"),
            "prefill_ms": med([row[name]["llmir"].get("prefill_ms") for row in rounds]),
            "prefill_vs_llama_cpp_f16": ratio(name, "llama.cpp", "prefill_ms", inverse=True),
            "prefill_vs_llmir_f32": ratio(name, "f32", "prefill_ms", inverse=True),
            "peak_rss_mb": med([row[name]["llmir"].get("peak_rss_mb") for row in rounds]),
            "load_s": med([row[name]["llmir"].get("load_s") for row in rounds]),
            "busy_rounds": sum(1 for row in rounds if row[name]["busy"]),
            "first_tokens_agree_with_llama_cpp": all(
                row[name]["first_tokens_agree"] for row in rounds
            ),
        }
    lc_dec = med([row["f32"]["llama.cpp"].get("decode_tok_s") for row in rounds])
    print(
        f"SmolLM2-135M shape, {a.threads} threads, prompt {a.prompt_len}, generate {a.gen_len}, "
        f"{a.rounds} rounds; llama.cpp f16 decode ~{lc_dec} tok/s; load {load_before}"
    )
    print(
        f"{'build':<13}{'kernel':<26}{'tok/s':>8}{'vs l.cpp':>10}{'vs f32':>8}"
        f"{'prefill':>9}{'vs l.cpp':>10}{'vs f32':>8}{'RSS MB':>8}{'load s':>8}"
    )

    def f(x: float | None, spec: str) -> str:
        return format(x, spec) if x is not None else "-"

    for name, s in summary.items():
        print(
            f"{name:<13}{s['kernel']:<26}{f(s['decode_tok_s'], '8.1f')}"
            f"{f(s['decode_vs_llama_cpp_f16'], '9.2f')}x{f(s['decode_vs_llmir_f32'], '7.2f')}x"
            f"{f(s['prefill_ms'], '9.0f')}{f(s['prefill_vs_llama_cpp_f16'], '9.2f')}x"
            f"{f(s['prefill_vs_llmir_f32'], '7.2f')}x{f(s['peak_rss_mb'], '8.0f')}"
            f"{f(s['load_s'], '8.2f')}"
        )
    doc = {
        "benchmark": "f16_vs_peers",
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "seconds": round(time.time() - t0, 1),
        "loadavg": {"before": load_before, "after": loadavg()},
        "note": "ratios within a round (each llmir build beside the same llama.cpp F16 run), "
        "medians over rounds; prefill ratios above 1 mean the build is faster",
        "summary": summary,
        "rounds": rounds,
    }
    out = Path(a.out) if a.out else work / "f16_vs_peers.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    log(f"wrote {out}")


def step_interleaved(
    arts: dict[str, Path], gguf: Path, threads: int, prompt_len: int, blocks: int, log: Any
) -> dict[str, Any]:
    """All tools loaded in this one process, taking turns block by block (a prefill of
    prompt_len, then 8 decode steps each, `blocks` times): on a shared machine the load drifts
    over seconds, so fine-grained turns compare the tools under the same load. Returns the
    median prefill ms and decode ms per token of each tool and their ratios."""
    import llama_cpp
    import numpy as np

    from llmir_core.targets.onnxruntime.runner import open_decoder

    rng = np.random.default_rng(0)
    ids = rng.integers(3, 49152, size=prompt_len).tolist()
    tools: dict[str, Any] = {n: open_decoder(str(a), threads=threads) for n, a in arts.items()}
    llm = llama_cpp.Llama(
        model_path=str(gguf),
        n_ctx=prompt_len + 8 * blocks + 16,
        n_batch=prompt_len,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    pre: dict[str, list[float]] = {n: [] for n in [*tools, "llama.cpp"]}
    dec: dict[str, list[float]] = {n: [] for n in pre}
    cpu: dict[str, list[float]] = {n: [] for n in pre}  # the thread's CPU time (threads == 1)
    tok: dict[str, int] = {}
    for name, d in tools.items():  # prefill each once; decode continues from there
        d.reset(1)
        tok[name] = int(d.forward(np.asarray([ids]))[0, -1].argmax())
    llm.reset()
    llm.eval(ids)
    tok["llama.cpp"] = 5
    for b in range(blocks):
        for name in pre:
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(8):
                if name == "llama.cpp":
                    llm.eval([tok[name]])
                else:
                    lg = tools[name].forward(np.asarray([[tok[name]]]))
                    tok[name] = int(lg[0, -1].argmax())
            dec[name].append((time.perf_counter() - t0) / 8 * 1e3)
            cpu[name].append((time.thread_time() - c0) / 8 * 1e3)
        if b % 4 == 0:  # a fresh prefill now and then (the caches keep growing otherwise)
            for name in pre:
                t0 = time.perf_counter()
                if name == "llama.cpp":
                    llm.reset()
                    llm.eval(ids)
                else:
                    tools[name].reset(1)
                    tools[name].forward(np.asarray([ids]))
                pre[name].append((time.perf_counter() - t0) * 1e3)
    out: dict[str, Any] = {}
    for name in pre:
        pm, dm = statistics.median(pre[name]), statistics.median(dec[name])
        out[name] = {"prefill_ms": pm, "decode_ms_per_token": dm}
        if threads == 1:
            out[name]["decode_cpu_ms_per_token"] = statistics.median(cpu[name])
    for name in tools:
        o = out[name]
        o["decode_vs_llama_cpp_f16"] = (
            out["llama.cpp"]["decode_ms_per_token"] / o["decode_ms_per_token"]
        )
        o["decode_vs_llmir_f32"] = out["f32"]["decode_ms_per_token"] / o["decode_ms_per_token"]
        o["prefill_vs_llama_cpp_f16"] = out["llama.cpp"]["prefill_ms"] / o["prefill_ms"]
        o["prefill_vs_llmir_f32"] = out["f32"]["prefill_ms"] / o["prefill_ms"]
        if threads == 1:
            lc_cpu = out["llama.cpp"]["decode_cpu_ms_per_token"]
            o["decode_cpu_vs_llama_cpp_f16"] = lc_cpu / o["decode_cpu_ms_per_token"]
            log(
                f"{name}: decode CPU {o['decode_cpu_ms_per_token']:.2f} ms/token "
                f"({o['decode_cpu_vs_llama_cpp_f16']:.2f}x llama.cpp f16 at {lc_cpu:.2f})"
            )
        log(
            f"{name}: decode {o['decode_ms_per_token']:.2f} ms/token "
            f"({o['decode_vs_llama_cpp_f16']:.2f}x llama.cpp f16, "
            f"{o['decode_vs_llmir_f32']:.2f}x llmir f32), prefill {o['prefill_ms']:.0f} ms "
            f"({o['prefill_vs_llama_cpp_f16']:.2f}x llama.cpp, {o['prefill_vs_llmir_f32']:.2f}x f32)"
        )
    lc = out["llama.cpp"]
    log(
        f"llama.cpp f16: decode {lc['decode_ms_per_token']:.2f} ms/token, prefill {lc['prefill_ms']:.0f} ms"
    )
    return out


def _busy(vs: dict[str, Any]) -> bool:
    """Whether any run of this comparison had other processes busy on the CPUs."""
    return any(run.get("busy") for run in vs.get("runs") or [])


if __name__ == "__main__":
    main()
