"""The README's main job, end to end through the CLI: make a tiny model, import, build, generate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("main_job")
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_tiny_llama.py"), str(d / "tiny")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    r = run_cli("import", str(d / "tiny"), "-o", str(d / "tiny.llmir"))
    assert r.returncode == 0, r.stderr
    r = run_cli("build", str(d / "tiny.llmir"), "-o", str(d / "tiny.build"), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["builder"] == "decoder"
    return d / "tiny.build"


def test_generate_streams_text_and_json_has_ids_and_timings(artifact: Path) -> None:
    r = run_cli("run", str(artifact), "--prompt", "Hello", "--max-new-tokens", "12")
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n") and len(r.stdout) > 1
    r = run_cli("run", str(artifact), "--prompt", "Hello", "-n", "12", "--format", "json")
    data = json.loads(r.stdout)
    res = data["results"][0]
    assert data["schema_version"] == 1 and len(res["token_ids"]) == 12
    assert res["timings"]["decode_tokens_per_s"] > 0 and res["stop_reason"] == "length"


def test_same_seed_same_text_and_sampling_flags(artifact: Path) -> None:
    args = (
        "run",
        str(artifact),
        "--prompt",
        "The quick",
        "-n",
        "16",
        "--temperature",
        "0.9",
        "--top-k",
        "40",
        "--top-p",
        "0.95",
        "--repetition-penalty",
        "1.1",
        "--format",
        "json",
    )
    a = json.loads(run_cli(*args, "--seed", "7").stdout)["results"][0]["token_ids"]
    b = json.loads(run_cli(*args, "--seed", "7").stdout)["results"][0]["token_ids"]
    assert a == b


def test_chat_from_a_pipe_and_prompts_file(artifact: Path, tmp_path: Path) -> None:
    r = run_cli("run", str(artifact), "--chat", "-n", "4", input="Hi\nHow are you?\n")
    assert r.returncode == 0, r.stderr
    f = tmp_path / "prompts.txt"
    f.write_text("one\n\ntwo\n")
    r = run_cli("run", str(artifact), "--prompts-file", str(f), "-n", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [x["prompt"] for x in json.loads(r.stdout)["results"]] == ["one", "two"]


def test_context_limit_is_a_warning_not_a_crash(artifact: Path, tmp_path: Path) -> None:
    small = tmp_path / "small.build"
    r = run_cli("build", str(artifact.parent / "tiny.llmir"), "-o", str(small), "--max-len", "12")
    assert r.returncode == 0, r.stderr
    r = run_cli("run", str(small), "--prompt", "Hi", "-n", "40", "--format", "json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    assert res["stop_reason"] == "context" and "context limit" in " ".join(res["warnings"])
    r = run_cli("run", str(small), "--prompt", "Hi", "-n", "40")
    assert (
        r.returncode == 0 and "warning: generation stopped at the model's context limit" in r.stderr
    )
    r = run_cli(
        "run", str(small), "--prompt", "a long prompt that is longer than twelve tokens", "-n", "2"
    )
    assert r.returncode == 2 and "context" in r.stderr


def test_run_usage_errors(artifact: Path, tmp_path: Path) -> None:
    r = run_cli("run", str(artifact))
    assert r.returncode == 2 and "nothing to run" in r.stderr
    r = run_cli("run", str(artifact), "--prompt", "x", "--temperature", "-1")
    assert r.returncode == 2 and "--temperature" in r.stderr
    src = artifact.parent / "tiny.llmir"
    r = run_cli("run", str(src), "--prompt", "x")
    assert r.returncode == 2 and "needs an artifact folder" in r.stderr
    assert "Traceback" not in r.stderr


def test_bench_json(artifact: Path) -> None:
    r = run_cli(
        "bench",
        str(artifact),
        "--prompt-len",
        "8",
        "--gen-len",
        "4",
        "--runs",
        "2",
        "--warmup",
        "0",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["results"]["decode_tokens_per_s_aggregate"]["mean"] > 0
    assert data["fingerprint"]["onnxruntime"]


def test_build_flags_only_for_decoders(tmp_path: Path) -> None:
    r = run_cli(
        "build",
        str(REPO / "examples" / "decoder.llmir"),
        "-o",
        str(tmp_path / "b"),
        "--quant",
        "int4",
    )
    assert r.returncode == 2 and "decoder builds only" in r.stderr
    assert not (tmp_path / "b").exists()
