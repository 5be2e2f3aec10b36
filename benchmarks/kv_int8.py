"""int8 KV cache (kv-cache-int8{scales=calibrated} -> GroupQueryAttention's int8 shared buffer)
vs the f32 KV cache, on the SmolLM2-135M shape with seeded random weights.

Builds two artifacts from one generated Hugging Face folder (tests/decoder/tiny.py's
SMOLLM2_135M): `llmir build` of the import (f32 KV) and of the import after
`kv-cache-int8{scales=calibrated}` (int8 KV, static per-head-per-channel scales from the
built-in calibration text). Then, batch 1, greedy, --threads intra-op threads:

- decode tok/s and peak RSS from `llmir bench` (one process per measurement, interleaved
  f32/int8 with the order rotated each round; medians over --rounds) at each --contexts prompt
  length, generating --gen tokens;
- the decode speed ratio measured in one process, the two decoders alternating blocks of 4
  steps at the same cache length (robust to a busy machine);
- KV bytes per token (manifest) and the KV memory the run holds (bytes per token x positions);
- greedy agreement with f32 KV over --agree tokens: free-running (same tokens until the first
  divergence) and teacher-forced (both fed f32's tokens; share of steps whose argmax agrees).

    python benchmarks/kv_int8.py --work /tmp/llmir-kv-int8 --contexts 128,1024 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare(work: Path) -> dict[str, Path]:
    sys.path.insert(0, str(REPO))
    from llmir_core.frontends.hf import import_hf
    from llmir_core.passes.manager import run_pipeline
    from llmir_core.passes.pipeline import parse_pipeline
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder
    from tests.decoder.tiny import SMOLLM2_135M, make_llama_folder

    hf = work / "smollm2-135m-random"
    if not (hf / "model.safetensors").is_file():
        log("generating the SmolLM2-135M-shaped random model ...")
        make_llama_folder(hf, SMOLLM2_135M, seed=0)
    arts = {"f32-kv": work / "art-f32-kv", "int8-kv": work / "art-int8-kv"}
    if not (arts["f32-kv"] / "manifest.json").is_file():
        log("building f32 KV ...")
        build_decoder(import_hf(hf), str(arts["f32-kv"]))
    if not (arts["int8-kv"] / "manifest.json").is_file():
        m = import_hf(hf)
        t0 = time.perf_counter()
        res = run_pipeline(m, parse_pipeline("kv-cache-int8{scales=calibrated}"))
        log(f"calibrated in {time.perf_counter() - t0:.1f} s: {res.ctx.rewrites[-1].detail}")
        log("building int8 KV ...")
        build_decoder(m, str(arts["int8-kv"]))
    return arts


def bench(art: Path, prompt: int, gen: int, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "llmir_cli.app", "bench", str(art), "--prompt-len", str(prompt)]
    cmd += ["--gen-len", str(gen), "--runs", "1", "--warmup", "1", "--threads", str(threads)]
    r = subprocess.run(
        [*cmd, "--format", "json"], capture_output=True, text=True, cwd=REPO, check=True
    )
    d = json.loads(r.stdout)
    res = d["results"]
    return {
        "decode_tok_s": res["decode_tokens_per_s_aggregate"]["mean"],
        "prefill_ms": res["prefill_ms"]["mean"],
        "peak_rss_mb": res["peak_rss_mb"],
        "load_average": d["fingerprint"].get("load_average"),
    }


def interleaved(arts: dict[str, Path], ctx: int, steps: int, block: int, threads: int) -> float:
    """Decode time ratio int8 / f32 at a `ctx`-token cache, measured in one process with the two
    decoders alternating blocks of `block` steps (ratios survive a busy machine better than
    absolute speeds): the median of the per-block ratios."""
    from llmir_core.targets.onnxruntime.runner import open_decoder

    decs = {k: open_decoder(str(p), threads=threads) for k, p in arts.items()}
    prompt = np.random.default_rng(1).integers(3, 120, (1, ctx))
    for d in decs.values():
        d.reserve(ctx + steps + 1)
        d.reset(1)
        d.forward(prompt)
    ratios = []
    tok = np.asarray([[5]])
    for _ in range(steps // block):
        t = {}
        for k, d in decs.items():
            t0 = time.perf_counter()
            for _ in range(block):
                d.forward(tok)
            t[k] = time.perf_counter() - t0
        ratios.append(t["int8-kv"] / t["f32-kv"])
    return statistics.median(ratios)


def agreement(arts: dict[str, Path], n: int, threads: int, seed: int = 0) -> dict[str, Any]:
    from llmir_core.targets.onnxruntime.runner import open_decoder

    a = open_decoder(str(arts["f32-kv"]), threads=threads)
    b = open_decoder(str(arts["int8-kv"]), threads=threads)
    vocab = a.vocab
    prompt = np.random.default_rng(seed).integers(3, min(vocab, 120), (1, 128))
    for d in (a, b):
        d.reserve(128 + n)
        d.reset(1)
    la, lb = a.forward(prompt)[:, -1], b.forward(prompt)[:, -1]
    forced = 0
    ref: list[int] = []
    for _ in range(n):
        ta, tb = int(la.argmax()), int(lb.argmax())
        forced += ta == tb
        ref.append(ta)
        la, lb = a.forward(np.asarray([[ta]]))[:, -1], b.forward(np.asarray([[ta]]))[:, -1]
    b.reset(1)
    lb = b.forward(prompt)[:, -1]
    free = []
    for _ in range(n):
        t = int(lb.argmax())
        free.append(t)
        lb = b.forward(np.asarray([[t]]))[:, -1]
    first = next((i for i, (x, y) in enumerate(zip(ref, free)) if x != y), n)
    return {
        "tokens": n,
        "free_running_identical_prefix": first,
        "free_running_same_position": sum(x == y for x, y in zip(ref, free)),
        "teacher_forced_agree": forced,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-kv-int8"))
    ap.add_argument("--contexts", default="128,1024", help="prompt lengths, comma-separated")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--agree", type=int, default=64)
    ap.add_argument("--json", type=Path, help="write every measurement here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    arts = prepare(args.work)
    kv = {
        k: json.loads((p / "manifest.json").read_text())["decoder"]["kv_bytes_per_token"]
        for k, p in arts.items()
    }
    runs: list[dict[str, Any]] = []
    names = list(arts)
    for rnd in range(args.rounds):
        for ctx in (int(x) for x in args.contexts.split(",")):
            for name in names[rnd % 2 :] + names[: rnd % 2]:
                r = bench(arts[name], ctx, args.gen, args.threads)
                r.update(variant=name, context=ctx, round=rnd)
                runs.append(r)
                log(json.dumps(r))
    ratio = {
        ctx: interleaved(arts, ctx, args.gen, 4, args.threads)
        for ctx in (int(x) for x in args.contexts.split(","))
    }
    agree = agreement(arts, args.agree, args.threads)
    print(f"KV bytes per token: f32 {kv['f32-kv']}, int8 {kv['int8-kv']}")
    print("| prompt | KV | decode tok/s | prefill ms | KV MB held | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for ctx in sorted({r["context"] for r in runs}):
        for name in names:
            sel = [r for r in runs if r["context"] == ctx and r["variant"] == name]
            med = {k: statistics.median(r[k] for r in sel) for k in sel[0] if k != "variant"}
            held = kv[name] * (ctx + args.gen) / 2**20
            print(
                f"| {ctx} | {name} | {med['decode_tok_s']:.1f} | {med['prefill_ms']:.0f} | "
                f"{held:.1f} | {med['peak_rss_mb']:.0f} |"
            )
        r8 = statistics.median(
            r["decode_tok_s"] for r in runs if r["context"] == ctx and r["variant"] == "int8-kv"
        )
        r32 = statistics.median(
            r["decode_tok_s"] for r in runs if r["context"] == ctx and r["variant"] == "f32-kv"
        )
        print(
            f"| {ctx} | int8/f32 decode speed | {r8 / r32:.2f}x (separate runs); "
            f"{1 / ratio[ctx]:.2f}x (interleaved in one process) | | | |"
        )
    print(
        f"greedy agreement over {agree['tokens']} tokens: identical prefix "
        f"{agree['free_running_identical_prefix']}, teacher-forced argmax agreement "
        f"{agree['teacher_forced_agree']}/{agree['tokens']}"
    )
    if args.json:
        out = {"kv_bytes_per_token": kv, "runs": runs, "int8_over_f32_step_time": ratio, **agree}
        args.json.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
