"""`llmir eval` on real weights: the `--quant int8` build of Gemma 3 270M Q4_K_M against its exact
build, over the first 256 tokens of tests/data/northanger_abbey.txt (windows of 128, stride 64).

`--quant int8` on a GGUF file keeps the tensors that repack losslessly into int8 blocks (Q5_0,
Q8_0) and requantizes the others (Q4_K to int4 blocks with zero points, Q6_K to int8 blocks):
the faster requantized form, whose cost `llmir eval` reports. Measured (docs/real-weights.md):
mean KL(exact || int8) 0.050, 99th percentile 0.29, top-1 agreement 90%, perplexity 31.87 against
31.58. The bounds leave about 2x margin on each side: a build that stops requantizing (KL near
0) fails as surely as one that requantizes worse, or an eval that scores the wrong tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

TEXT = Path(__file__).resolve().parent.parent / "data" / "northanger_abbey.txt"
KL_MEAN = (0.02, 0.1)
KL_P99_MAX = 0.6
TOP1_MIN = 0.8
PPL_RATIO_MAX = 1.05


def test_int8_build_against_exact(
    gemma_artifact: Callable[[str], Path], llmir_cli: Callable[..., str]
) -> None:
    exact, int8 = gemma_artifact("exact"), gemma_artifact("int8")
    out = json.loads(llmir_cli(
        "eval", str(int8), "--text", str(TEXT), "--against", str(exact),
        "--ctx", "128", "--max-tokens", "256", "--format", "json",
    ))  # fmt: skip
    assert out["scored_tokens"] == 256 and out["windows"] == 4
    c = out["comparison"]
    assert KL_MEAN[0] <= c["kl_mean"] <= KL_MEAN[1], c
    assert c["kl_p99"] <= KL_P99_MAX, c
    assert c["top1_agreement"] >= TOP1_MIN, c
    assert 1 / PPL_RATIO_MAX <= c["perplexity_ratio"] <= PPL_RATIO_MAX, c
