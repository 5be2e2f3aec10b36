"""`llmir bench ARTIFACT`: the JSON schema, the human table, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.textgen import bench_artifact
from tests.conftest import run_cli


def test_bench_json_schema(tiny_artifact: Path) -> None:
    r = run_cli(
        "bench",
        str(tiny_artifact),
        "--prompt-len",
        "8",
        "--gen-len",
        "4",
        "--runs",
        "2",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["schema_version"] == 1 and data["kind"] == "bench" and data["bench_schema"] == 1
    assert data["config"] == {
        "prompt_len": 8,
        "gen_len": 4,
        "batch": 1,
        "threads": 1,
        "spin": False,  # one thread: no pool threads to spin
        "runs": 2,
    }
    res = data["results"]
    for key in ("prefill_ms", "prefill_tokens_per_s", "ttft_ms", "decode_tokens_per_s"):
        assert set(res[key]) == {"mean", "stddev"} and res[key]["mean"] > 0
    assert set(res["itl_ms"]) == {"p50", "p90", "p99"} and res["peak_rss_mb"] > 0
    assert len(data["runs"]) == 2 and all(len(run["itl_s"]) == 3 for run in data["runs"])
    fp = data["fingerprint"]
    for key in (
        "cpu",
        "cores",
        "cpu_flags",
        "llmir",
        "onnxruntime",
        "model_sha256",
        "kv_cache",
        "weights",
    ):
        assert key in fp
    assert fp["kv_cache"] == "shared_buffer" and len(fp["model_sha256"]) == 64


def test_bench_human_table(tiny_artifact: Path) -> None:
    r = run_cli(
        "bench",
        str(tiny_artifact),
        "--prompt-len",
        "4",
        "--gen-len",
        "2",
        "--runs",
        "1",
        "--warmup",
        "0",
    )
    assert r.returncode == 0, r.stderr
    for row in ("prefill", "time to first token", "decode speed", "P50 / P90 / P99", "peak RSS"):
        assert row in r.stdout


def test_bench_errors(tiny_artifact: Path, tmp_path: Path) -> None:
    r = run_cli("bench", str(tmp_path))
    assert r.returncode == 2 and "no manifest.json" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(InputError, match="exceeds the model's context of 256"):
        bench_artifact(str(tiny_artifact), prompt_len=250, gen_len=10)
    with pytest.raises(InputError, match="--runs must be >= 1"):
        bench_artifact(str(tiny_artifact), runs=0)
