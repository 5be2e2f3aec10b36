"""KV memory you can see: /metrics' reserved and touched KV bytes, the default --max-context
capped to the machine's memory (MemAvailable faked through kv_budget.mem_available), and the
start-up lines of `llmir serve` that say both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmir_core.runtime import kv_budget
from llmir_core.runtime.kv_slots import KVUsage
from tests.decoder.tiny import TINY, make_llama_folder

from .conftest import start_server
from .test_bad_input import call

# the tiny model's KV bytes per position: layers x (K, V) x kv_heads x head_dim x 4 bytes (f32)
TOKEN_BYTES = TINY.layers * 2 * TINY.kv_heads * (TINY.hidden // TINY.heads) * 4
LONG_CONTEXT = 4096


def _gauge(text: str, name: str) -> int:
    found = re.search(rf"^{name} (\d+)$", text, re.M)
    assert found, f"{name} missing from /metrics:\n{text}"
    assert f"# TYPE {name} gauge" in text
    return int(found.group(1))


def test_metrics_report_reserved_and_touched_kv(tiny_artifact: Path) -> None:
    srv = start_server(tiny_artifact, max_batch=2, max_queue=4, chunk=8)
    try:
        _, _, text = call(srv.url, "GET", "/metrics")
        reserved = 2 * srv.model.max_context * TOKEN_BYTES  # slots x context x bytes a position
        assert _gauge(text, "llmir_kv_reserved_bytes") == reserved
        assert _gauge(text, "llmir_kv_touched_bytes") == 0
        body = json.dumps(
            {"model": srv.model.name, "prompt": "hello there", "max_tokens": 5, "temperature": 0}
        )
        status, _, data = call(srv.url, "POST", "/v1/completions", body)
        assert status == 200, data
        usage = data["usage"]
        # the prompt's rows, then one row per token fed back (every generated one but the last)
        rows = usage["prompt_tokens"] + usage["completion_tokens"] - 1
        _, _, text = call(srv.url, "GET", "/metrics")
        assert _gauge(text, "llmir_kv_touched_bytes") == rows * TOKEN_BYTES
        assert _gauge(text, "llmir_kv_reserved_bytes") == reserved
    finally:
        srv.stop()


def test_kv_usage_counts_high_water_marks_and_the_dummy_row() -> None:
    u = KVUsage(slots=3, limit=10, token_bytes=4)
    u.wrote(0, 6)
    u.wrote(0, 2)  # a shorter sequence reusing the slot: the rows above stay written
    u.decoded([2], [3], rows=3)  # slot 2 writes row 3; slots 0 and 1 the dummy row 9
    assert u.touched_bytes == ((6 + 1) + 1 + 4) * 4
    u.wrote(1, 10)  # the dummy row is now inside the slot's written rows
    assert u.touched_bytes == ((6 + 1) + 10 + 4) * 4


@pytest.fixture(scope="module")
def long_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a 4096-token context (what the memory default can cap)."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    folder = make_llama_folder(
        tmp_path_factory.mktemp("long") / "llama", replace(TINY, context=LONG_CONTEXT)
    )
    out = tmp_path_factory.mktemp("art_long") / "llama"
    build_decoder(import_hf(folder), str(out))
    return out


def _open(art: Path, monkeypatch: pytest.MonkeyPatch, available: int | None, **opts: Any) -> Any:
    from llmir_core.serve.model import open_served_model

    monkeypatch.setattr(kv_budget, "mem_available", lambda: available)
    return open_served_model(str(art), threads=1, **opts)


def test_default_context_capped_to_available_memory(
    long_artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = kv_budget.artifact_bytes(json.loads((long_artifact / "manifest.json").read_text()))
    full = 8 * LONG_CONTEXT * TOKEN_BYTES  # 16 MiB at the model's context
    # half of (available - weights) is 4 MiB: 1024 tokens for each of 8 slots
    m = _open(long_artifact, monkeypatch, weights + 8 * 2**20, max_batch=8)
    assert m.max_context == 1024 and m.decoder.kv_bytes == 8 * 1024 * TOKEN_BYTES
    assert m.context_note.startswith(
        f"max context 1024 (model: {LONG_CONTEXT}): 8 slots x {LONG_CONTEXT} x 512 B = 16 MiB "
        "would not fit in 4 MiB (50% of"
    ), m.context_note
    # the cap is a multiple of 256 tokens: 1.9 MiB a half gives 3 slots 1280 tokens
    m = _open(long_artifact, monkeypatch, weights + int(3.8 * 2**20), max_batch=3)
    assert m.max_context == 1280
    # plenty of memory: the model's context
    m = _open(long_artifact, monkeypatch, weights + 4 * full, max_batch=8)
    assert m.max_context == LONG_CONTEXT and "(the model's)" in m.context_note
    assert "fits in" in m.context_note
    # no memory left: the least context (256 tokens), said so
    m = _open(long_artifact, monkeypatch, weights // 2, max_batch=8)
    assert m.max_context == 256 and "the least it opens with" in m.context_note
    # MemAvailable unknown: the model's context
    m = _open(long_artifact, monkeypatch, None, max_batch=8)
    assert m.max_context == LONG_CONTEXT and "MemAvailable unknown" in m.context_note


def test_explicit_max_context_is_kept(long_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = _open(long_artifact, monkeypatch, 1, max_batch=8, max_context=3000)
    assert m.max_context == 3000 and m.decoder.kv_bytes == 8 * 3000 * TOKEN_BYTES
    assert m.context_note == (
        f"max context 3000 (--max-context 3000; model: {LONG_CONTEXT}): 8 slots x 3000 x 512 B "
        "= 11.7 MiB"
    )
    m = _open(long_artifact, monkeypatch, None, max_batch=2, max_context=9000)
    assert m.max_context == LONG_CONTEXT  # no more than the model's
    assert m.context_note.startswith(f"max context {LONG_CONTEXT} (--max-context 9000; model:")


def test_serve_start_lines_say_kv_memory_and_context(tiny_artifact: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "llmir_cli.app", "serve", str(tiny_artifact), "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--max-batch", "2", "--threads", "1"], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stderr is not None
        first, note = proc.stderr.readline(), proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(60)
    assert re.search(r"http://127\.0\.0\.1:\d+/", first), first  # the URL stays on line 1
    assert "2 slots of 256 tokens, KV cache 256 KiB reserved, 0 B touched, queue" in first, first
    assert note.startswith(
        f"max context {TINY.context} (the model's): 2 slots x {TINY.context} x 512 B = 256 KiB "
        "fits in"
    ), note


def test_mem_available_reads_meminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    5242880 kB\n")
    monkeypatch.setattr(kv_budget, "MEMINFO", str(info))
    assert kv_budget.mem_available() == 5 * 2**30
    info.write_text("MemTotal:       16000000 kB\n")  # an old kernel: no MemAvailable
    assert kv_budget.mem_available() is None
    monkeypatch.setattr(kv_budget, "MEMINFO", str(tmp_path / "absent"))
    assert kv_budget.mem_available() is None
