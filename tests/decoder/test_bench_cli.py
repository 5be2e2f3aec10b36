"""`llmir bench ARTIFACT`: the JSON schema, the human table, and the errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.textgen import bench_artifact
from llmir_core.targets.onnxruntime.native import unavailable_reason
from tests.conftest import requires, run_cli

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")


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
    assert data["schema_version"] == 1 and data["kind"] == "bench" and data["bench_schema"] == 2
    assert data["config"] == {
        "prompt_len": 8,
        "gen_len": 4,
        "batch": 1,
        "threads": 1,
        "spin": False,  # one thread: no pool threads to spin
        "runs": 2,
    }
    res = data["results"]
    for key in (
        "prefill_ms",
        "prefill_tokens_per_s",
        "ttft_ms",
        "decode_tokens_per_s_aggregate",
        "decode_tokens_per_s_per_sequence",
    ):
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
    assert set(data["kernels"]) <= _llmir_ops(tiny_artifact)  # only the ops the graph runs


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
    for row in (
        "prefill",
        "time to first token",
        "decode speed, whole batch",
        "decode speed, per sequence",
        "P50 / P90 / P99",
        "peak RSS",
    ):
        assert row in r.stdout


def test_bench_errors(tiny_artifact: Path, tmp_path: Path) -> None:
    r = run_cli("bench", str(tmp_path))
    assert r.returncode == 2 and "no manifest.json" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(InputError, match="exceeds the model's context of 256"):
        bench_artifact(str(tiny_artifact), prompt_len=250, gen_len=10)
    with pytest.raises(InputError, match="--runs must be >= 1"):
        bench_artifact(str(tiny_artifact), runs=0)


def _llmir_ops(art: Path) -> set[str]:
    """The op types of llmir's own library (domain ai.llmir) in an artifact's ONNX graph."""
    import onnx

    graph = onnx.load(str(art / "model.onnx"), load_external_data=False).graph
    return {n.op_type for n in graph.node if n.domain == "ai.llmir"}


@needs_kernel
def test_bench_names_kernel_variants(
    tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kernels` names the ISA variant of exactly the llmir ops the artifact runs, as the library
    reports it under LLMIR_KERNEL_ISA; avx2 forces the fallback everywhere."""
    from llmir_core.targets import build, lower
    from llmir_core.targets.onnxruntime.native import kernel_variants

    art = tmp_path / "s8"
    build(lower(tiny_module, options={"quant": "int8", "int8_matmul": "llmir"}), str(art))
    used = _llmir_ops(art)
    assert "MatMulS8" in used
    for isa in ("auto", "avx2"):
        monkeypatch.setenv("LLMIR_KERNEL_ISA", isa)
        res = bench_artifact(str(art), prompt_len=4, gen_len=2, runs=1, warmup=0, threads=1)
        table = kernel_variants()
        assert set(res.kernels) == used & set(table) and "MatMulS8" in res.kernels
        assert res.kernels == {op: table[op] for op in res.kernels}
        assert res.to_json()["kernels"] == res.kernels
    assert set(res.kernels.values()) == {"avx2"}
    r = run_cli(
        "bench", str(art), "--prompt-len", "4", "--gen-len", "2", "--runs", "1", "--warmup", "0",
        "--threads", "1", "--format", "json",
        env={"LLMIR_KERNEL_ISA": "avx2"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kernels"] == res.kernels
    r = run_cli(
        "bench", str(art), "--prompt-len", "4", "--gen-len", "2", "--runs", "1", "--warmup", "0",
        "--threads", "1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "kernel variants: " in r.stdout and "MatMulS8=" in r.stdout
