"""benchmarks/gpu_decode.py runs end to end on a tiny model in interpreter mode (on a GPU it
runs the SmolLM2-135M / Qwen2.5-0.5B / Llama-3-8B shapes; none is lent to these tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the benchmark needs torch")
pytest.importorskip("triton", reason="the benchmark needs triton")
pytest.importorskip("transformers", reason="the benchmark compares with transformers")

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.mark.slow
def test_gpu_decode_tiny_interpreted(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_decode.py"),
            "--tiny",
            "--prompt-len",
            "6",
            "--gen-len",
            "2",
            "--check-tokens",
            "3",
            "--copy-bytes",
            "100000",
            "--arch",
            "none",
            "--variants",
            "llmir-f16,llmir-int4,hf-eager",
            "--work",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(out.read_text())
    runs = r["shapes"]["tiny"]
    assert set(runs) == {"llmir-f16", "llmir-int4", "hf-eager"}
    assert runs["llmir-f16"]["tokens_agree_with_hf"] is True
    for v in ("llmir-f16", "llmir-int4"):
        assert (
            runs[v]["decode_tok_s"] > 0
            and runs[v]["bytes_per_token"] > 0
            and len(runs[v]["tokens"]) == 3
        )
        assert runs[v]["decode_x_hf-eager"] > 0
    assert "llmir-int4" in res.stdout.splitlines()[-2]


def test_gpu_decode_rejects_unknown_shape(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_decode.py"),
            "--shapes",
            "gpt5",
            "--work",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2 and "unknown shape" in res.stderr
