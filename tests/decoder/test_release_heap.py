"""Opening an artifact hands the heap onnxruntime freed while folding the rotary tables back to
the system (runtime/ort_decoder.py, `release_freed_heap`): peak RSS against llama.cpp on the real
Gemma 3 file is one of issue 22's targets."""

from __future__ import annotations

import ctypes.util
import sys
from pathlib import Path
from typing import Any

import pytest

from llmir_core.targets.onnxruntime import batch_runner
from llmir_core.targets.onnxruntime import runner as ort_decoder


def _rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not ctypes.util.find_library("c"),
    reason="glibc's malloc_trim and /proc are Linux's",
)
def test_freed_heap_goes_back_to_the_system() -> None:
    # 96 MB of 64 KiB heap blocks, then one kept block above them so that the freed ones are
    # not at the top of the heap (glibc trims the top by itself, not the middle)
    blocks = [bytearray(b"x" * 65536) for _ in range(1536)]
    keep = bytearray(b"y" * 65536)
    del blocks
    before = _rss_anon_mb()
    ort_decoder.release_freed_heap()
    after = _rss_anon_mb()
    assert keep[0] == ord("y")
    assert before - after > 48, f"RssAnon {before:.0f} -> {after:.0f} MB"


def test_opening_an_artifact_trims_the_heap(
    tiny_artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def spy() -> bool:
        calls.append("trim")
        return True

    monkeypatch.setattr(ort_decoder, "release_freed_heap", spy)
    dec: Any = ort_decoder.open_decoder(str(tiny_artifact), threads=1)
    assert calls == ["trim"] and dec.sess is not None
    batch_runner.OrtBatchDecoder(str(tiny_artifact), slots=1, threads=1)
    assert calls == ["trim", "trim"]
