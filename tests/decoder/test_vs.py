"""`llmir bench --vs PEER`: llmir beside other runtimes on the same weights, and the peer errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llmir_core.errors import InputError
from llmir_core.runtime import peers
from tests.conftest import run_cli


def test_vs_transformers_on_the_same_weights(tiny_artifact: Path, tiny_dir: Path) -> None:
    pytest.importorskip("transformers")
    r = run_cli(
        "bench",
        str(tiny_artifact),
        "--vs",
        f"transformers:{tiny_dir}",
        "--prompt-len",
        "8",
        "--gen-len",
        "17",
        "--runs",
        "1",
        "--threads",
        "1",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kind"] == "bench-vs" and d["peers_schema"] == 1
    cfg = d["config"]
    assert cfg["threads"] == 1 and len(cfg["prompt_ids"]) == 8 and cfg["agree"] == 16
    s = d["summary"]
    assert list(s) == ["llmir", "transformers:llama"]
    peer, me = s["transformers:llama"], s["llmir"]
    for m in ("prefill_ms", "ttft_ms", "decode_tok_s", "peak_rss_mb", "load_s", "import_s"):
        assert me[m] > 0 and peer[m] > 0 and me["ratio_to_llmir"][m] == 1.0
        assert peer["ratio_to_llmir"][m] == pytest.approx(peer[m] / me[m])
    assert len(peer["first_tokens"]) == 16 and peer["agrees"] and peer["first_difference"] is None
    assert {x["tool"] for x in d["runs"]} == {"llmir", "transformers:llama"}
    assert all(len(x["tokens"]) == 17 for x in d["runs"])
    # whether llmir's pool threads spun is in each of its runs (1 thread: never)
    assert [x["spin"] for x in d["runs"] if x["tool"] == "llmir"] == [False]
    fp = d["fingerprint"]
    assert fp["peer_versions"]["transformers"] and fp["cpu"] and fp["weights"] == "f32"


def test_vs_table(tiny_artifact: Path) -> None:
    res = peers.VsResult(
        {"prompt_len": 4, "gen_len": 3, "runs": 1, "threads": 1, "agree": 3},
        [peers.Peer("llmir", str(tiny_artifact)), peers.Peer("llama.cpp", "/m/smol.gguf")],
    )
    base = {
        "prefill_ms": 2.0,
        "ttft_ms": 2.5,
        "decode_tok_s": 100.0,
        "peak_rss_mb": 80.0,
        "load_s": 0.5,
        "import_s": 0.2,
    }
    res.runs = [
        {**base, "tool": "llmir", "busy": False, "tokens": [5, 6, 7]},
        {
            **base,
            "decode_tok_s": 150.0,
            "tool": "llama.cpp:smol.gguf",
            "busy": True,
            "tokens": [5, 9, 7],
        },
    ]
    text = peers.format_table(res)
    assert (
        "llama.cpp:smol.gguf" in text
        and "differ at token 1" in text
        and "[1 of 1 runs busy]" in text
    )
    assert "1.5x" in text  # decode tok/s ratio to llmir
    assert "did not spin" not in text  # 1 thread: no pool threads to spin


def test_vs_table_says_when_llmir_did_not_spin(tiny_artifact: Path) -> None:
    res = peers.VsResult(
        {"prompt_len": 4, "gen_len": 3, "runs": 2, "threads": 2, "agree": 3},
        [peers.Peer("llmir", str(tiny_artifact)), peers.Peer("llama.cpp", "/m/smol.gguf")],
    )
    run = {
        "prefill_ms": 2.0,
        "ttft_ms": 2.5,
        "decode_tok_s": 100.0,
        "peak_rss_mb": 80.0,
        "load_s": 0.5,
        "import_s": 0.2,
        "busy": False,
        "tokens": [5, 6, 7],
    }
    res.runs = [
        {**run, "tool": "llmir", "spin": False},
        {**run, "tool": "llmir", "spin": True},
        {**run, "tool": "llama.cpp:smol.gguf", "spin": None},
    ]
    assert "llmir's threads did not spin in 1 of 2 runs" in peers.format_table(res)
    res.runs[0]["spin"] = True
    assert "did not spin" not in peers.format_table(res)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("foo:x", "unknown peer 'foo' (known: ort-genai, transformers, llama.cpp)"),
        ("transformers", "expected KIND:PATH"),
        ("transformers:/no/such/folder", "/no/such/folder: no such file or folder"),
    ],
)
def test_vs_bad_peer_spec(tiny_artifact: Path, spec: str, message: str) -> None:
    r = run_cli("bench", str(tiny_artifact), "--vs", spec)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_vs_peer_that_fails_to_load(tiny_artifact: Path, tmp_path: Path) -> None:
    """A peer whose library cannot load the folder: one error line naming the peer, exit 2."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "config.json").write_text('{"model_type": "no-such-arch"}')
    r = run_cli(
        "bench",
        str(tiny_artifact),
        "--vs",
        f"transformers:{tmp_path / 'fake'}",
        "--runs",
        "1",
        "--prompt-len",
        "4",
        "--gen-len",
        "2",
        "--threads",
        "1",
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and err[0].startswith("error: transformers:fake: ")
    r = run_cli("bench", str(tiny_artifact), "--vs", f"ort-genai:{tmp_path / 'fake'}", "--profile")
    assert r.returncode == 2 and "either --profile or --vs" in r.stderr


def test_vs_peer_library_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    with pytest.raises(InputError, match="peer llama.cpp needs the `llama_cpp` package") as e:
        peers.worker(
            {
                "kind": "llama.cpp",
                "path": str(tmp_path / "m.gguf"),
                "ids": [1, 2],
                "gen_len": 2,
                "threads": 1,
            }
        )
    assert e.value.hint == "pip install llama-cpp-python"


def test_vs_checks_lengths(tiny_artifact: Path, tiny_dir: Path) -> None:
    peer = peers.parse_peer(f"transformers:{tiny_dir}")
    with pytest.raises(InputError, match="exceeds the model's context of 256"):
        peers.compare(str(tiny_artifact), [peer], prompt_len=250, gen_len=10)
    with pytest.raises(InputError, match="the same peer is given twice"):
        peers.compare(str(tiny_artifact), [peer, peer], prompt_len=4, gen_len=2)


def test_vs_ort_genai(tiny_artifact: Path, tiny_dir: Path, tmp_path: Path) -> None:
    """onnxruntime-genai's own build of the same folder (its builder needs onnx-ir and torch)."""
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("onnx_ir")
    import subprocess

    out = tmp_path / "genai"
    b = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(tiny_dir),
            "-o",
            str(out),
            "-p",
            "fp32",
            "-e",
            "cpu",
            "-c",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert b.returncode == 0, b.stderr[-2000:]
    r = run_cli(
        "bench",
        str(tiny_artifact),
        "--vs",
        f"ort-genai:{out}",
        "--prompt-len",
        "8",
        "--gen-len",
        "17",
        "--runs",
        "1",
        "--threads",
        "1",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]["ort-genai:genai"]
    assert s["agrees"] and s["decode_tok_s"] > 0 and s["peak_rss_mb"] > 0
