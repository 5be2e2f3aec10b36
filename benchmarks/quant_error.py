"""Output error of quantized decoder artifacts against an f32 artifact of the same model: the
max |logit difference| (prefill of a --prompt-len prompt, then --tokens teacher-forced decode
steps fed the f32 model's greedy tokens) and greedy agreement over --tokens tokens (free running:
the identical prefix and same-position matches; teacher forced: steps whose argmax agrees).

    python benchmarks/quant_error.py F32_DIR INT4_F32SCALES_DIR INT4_F16SCALES_DIR --tokens 128

Prints one row per artifact; --json writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def compare(
    ref_dir: str, art_dir: str, tokens: int, prompt_len: int, threads: int
) -> dict[str, Any]:
    from llmir_core.targets.onnxruntime.runner import open_decoder

    a = open_decoder(ref_dir, threads=threads)
    b = open_decoder(art_dir, threads=threads)
    prompt = np.random.default_rng(0).integers(3, min(a.vocab, 1000), (1, prompt_len))
    for d in (a, b):
        d.reserve(prompt_len + tokens + 1)
        d.reset(1)
    la, lb = a.forward(prompt)[0, -1], b.forward(prompt)[0, -1]
    worst, forced, ref = float(np.abs(la - lb).max()), 0, []
    peak = float(np.abs(la).max())
    for _ in range(tokens):
        ta = int(la.argmax())
        forced += ta == int(lb.argmax())
        ref.append(ta)
        step = np.asarray([[ta]])
        la, lb = a.forward(step)[0, -1], b.forward(step)[0, -1]
        worst = max(worst, float(np.abs(la - lb).max()))
        peak = max(peak, float(np.abs(la).max()))
    b.reset(1)
    lb = b.forward(prompt)[0, -1]
    free = []
    for _ in range(tokens):
        t = int(lb.argmax())
        free.append(t)
        lb = b.forward(np.asarray([[t]]))[0, -1]
    prefix = next((i for i, (x, y) in enumerate(zip(ref, free)) if x != y), tokens)
    return {
        "artifact": art_dir,
        "max_logit_diff": worst,
        "max_abs_f32_logit": peak,
        "tokens": tokens,
        "free_running_identical_prefix": prefix,
        "free_running_same_position": sum(x == y for x, y in zip(ref, free)),
        "teacher_forced_agree": forced,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("f32", help="the f32 artifact (the reference)")
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = [compare(a.f32, d, a.tokens, a.prompt_len, a.threads) for d in a.artifacts]
    for r in rows:
        print(
            f"{r['artifact']}: max |logit diff| {r['max_logit_diff']:.4f} (max |f32 logit| "
            f"{r['max_abs_f32_logit']:.1f}), free-running identical "
            f"prefix {r['free_running_identical_prefix']}/{r['tokens']}, same position "
            f"{r['free_running_same_position']}/{r['tokens']}, teacher-forced argmax agree "
            f"{r['teacher_forced_agree']}/{r['tokens']}"
        )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
