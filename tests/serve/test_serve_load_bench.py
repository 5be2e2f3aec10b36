"""benchmarks/serve_load.py's pure parts on fixed inputs, no server: reading both servers'
completion streams, the percentile, per-level statistics and ratios, and the table."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:  # benchmarks/ is not a package: load the script as a module
    spec = importlib.util.spec_from_file_location("serve_load", REPO / "benchmarks/serve_load.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_load"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def _sse(*events: object) -> list[bytes]:
    out = []
    for ev in events:
        out.append(b"data: " + (ev if isinstance(ev, bytes) else json.dumps(ev).encode()) + b"\n")
        out.append(b"\n")
    return out


def _chunk(text: str | None, finish: str | None = None, **extra: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra}


def _timed(lines: list[bytes], step: float = 0.5) -> list[tuple[float, bytes]]:
    return [(10.0 + i * step, raw) for i, raw in enumerate(lines)]


# llmir serve: text chunks, a last chunk with text null, finish_reason and usage, [DONE]
LLMIR = _sse(
    _chunk(" the"),
    _chunk(" river"),
    _chunk(" ran"),
    _chunk(None, "stop", usage={"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}),
    b"[DONE]",
)
# llama-server: an empty first chunk, text chunks with timings, a last chunk with text "",
# usage and timings, [DONE]
TIMINGS = {"predicted_n": 1, "predicted_per_second": 50.0}
LLAMA = _sse(
    _chunk("", timings=TIMINGS),
    _chunk(" the", timings=TIMINGS),
    _chunk(" river", timings=TIMINGS),
    _chunk("", timings=TIMINGS),  # a token whose bytes finish in the next chunk
    _chunk(" ran", timings=TIMINGS),
    _chunk(
        "",
        "length",
        usage={"completion_tokens": 4, "prompt_tokens": 9, "total_tokens": 13},
        timings=TIMINGS,
    ),
    b"[DONE]",
)


def test_reads_llmir_stream(bench: ModuleType) -> None:
    a = bench.read_stream(bench.Answer(sent=9.0, status=200), _timed(LLMIR))
    assert a.ok and a.error is None
    assert (a.chunks, a.tokens, a.prompt_tokens, a.finish) == (3, 3, 9, "stop")
    assert (a.first, a.last) == (10.0, 12.0)  # lines 0 and 4 (blank separators between)


def test_reads_llama_server_stream(bench: ModuleType) -> None:
    a = bench.read_stream(bench.Answer(sent=9.0, status=200), _timed(LLAMA))
    assert a.ok
    assert a.chunks == 3 and a.tokens == 4  # usage's count wins over the text chunks
    assert (a.first, a.last, a.finish) == (11.0, 14.0, "length")  # empty first chunk skipped


def test_stream_errors(bench: ModuleType) -> None:
    err = _sse(_chunk(" a"), {"error": {"code": 500, "message": "boom", "type": "server_error"}})
    a = bench.read_stream(bench.Answer(sent=0.0, status=200), _timed(err))
    assert not a.ok and a.error == "boom" and a.chunks == 1
    cut = bench.read_stream(bench.Answer(sent=0.0, status=200), _timed(LLMIR[:4]))
    assert not cut.ok and "without [DONE]" in cut.error and cut.tokens == 2
    bad = bench.read_stream(bench.Answer(sent=0.0, status=200), _timed(_sse(b"{nope")))
    assert not bad.ok and bad.error.startswith("bad event")


def test_percentile_matches_linear_interpolation(bench: ModuleType) -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert bench.percentile(xs, 50) == 3.0
    assert bench.percentile(xs, 0) == 1.0 and bench.percentile(xs, 100) == 5.0
    assert bench.percentile(xs, 99) == pytest.approx(4.96)  # 4 + 0.96 x (5 - 4)
    assert bench.percentile(xs, 25) == 2.0
    assert bench.percentile([1.0, 2.0], 50) == 1.5
    assert bench.percentile([7.0], 99) == 7.0
    assert math.isnan(bench.percentile([], 50))


def _answer(bench: ModuleType, sent: float, first: float, last: float, tokens: int) -> object:
    a = bench.Answer(sent=sent, status=200, first=first, last=last, chunks=tokens, done=True)
    a.prompt_tokens = 10
    return a


def test_summarize(bench: ModuleType) -> None:
    answers = [
        _answer(bench, 0.0, 0.5, 3.5, 4),  # TTFT 0.5, 3 tokens in 3 s: 1 tok/s
        _answer(bench, 0.0, 1.0, 2.0, 3),  # TTFT 1.0, 2 tokens in 1 s: 2 tok/s
        _answer(bench, 1.0, 3.0, 3.5, 2),  # TTFT 2.0, 1 token in 0.5 s: 2 tok/s
        bench.Answer(sent=0.0, status=429, error="HTTP 429: busy"),
        bench.Answer(sent=0.0, status=200, error="boom"),
        bench.Answer(sent=0.0, status=0, error="ConnectionResetError: x"),
    ]
    s = bench.summarize(answers, 4.5)
    assert (s.requests, s.ok, s.errors, s.rejected, s.tokens) == (6, 3, 2, 1, 9)
    assert s.tok_s == pytest.approx(2.0)  # 9 tokens / 4.5 s
    assert s.req_tok_s == pytest.approx(2.0)  # median of 1, 2, 2
    assert s.ttft_p50_s == pytest.approx(1.0)
    assert s.ttft_p99_s == pytest.approx(1.98)  # 1.0 + 0.98 x (2.0 - 1.0)
    assert s.tokens_per_req == pytest.approx(3.0)
    assert s.prompt_tokens == 10
    assert s.error_samples == ["ConnectionResetError: x", "boom"]


def _stats(bench: ModuleType, tok_s: float, ttft: float, **kw: object) -> object:
    base = dict(
        requests=16,
        ok=16,
        errors=0,
        rejected=0,
        tokens=1024,
        wall_s=10.0,
        tok_s=tok_s,
        req_tok_s=tok_s / 8,
        ttft_p50_s=ttft / 2,
        ttft_p99_s=ttft,
        tokens_per_req=64.0,
        prompt_tokens=30.0,
        others_cores=0.1,
    )
    return bench.LevelStats(**{**base, **kw})


def test_medians_over_rounds_and_ratio(bench: ModuleType) -> None:
    runs = [
        _stats(bench, 100.0, 0.4, errors=1),
        _stats(bench, 80.0, 0.6, rejected=2),
        _stats(bench, 120.0, 0.2, errors=2),
    ]
    m = bench.median_stats(runs)
    assert (m.tok_s, m.ttft_p99_s, m.errors, m.rejected, m.requests) == (100.0, 0.4, 3, 2, 48)
    assert bench.ratio(150.0, 100.0) == 1.5
    assert math.isnan(bench.ratio(1.0, 0.0)) and math.isnan(bench.ratio(math.nan, 2.0))


def test_table(bench: ModuleType) -> None:
    table = {
        8: {
            "llmir": _stats(bench, 68.0, 2.25, errors=3, others_cores=0.9),
            "llama-server": _stats(bench, 115.0, 0.44, rejected=1),
        },
        1: {"llmir": _stats(bench, 69.0, 0.1), "llama-server": _stats(bench, 55.0, 0.2)},
    }
    lines = bench.render_table(table).splitlines()
    assert lines[0].split()[:4] == ["clients", "server", "agg", "tok/s"]
    rows = [ln.split() for ln in lines[1:]]
    assert [r[:2] for r in rows] == [
        ["1", "llmir"],
        ["1", "llama-server"],
        ["1", "llmir/llama"],
        ["8", "llmir"],
        ["8", "llama-server"],
        ["8", "llmir/llama"],
    ]
    # agg, per request, TTFT p50 ms, TTFT p99 ms, tok/req, errors, 429, others
    assert rows[3][2:] == ["68.0", "8.5", "1125", "2250", "64.0", "3", "0", "0.90!"]
    assert rows[4][2:] == ["115.0", "14.4", "220", "440", "64.0", "0", "1", "0.10"]
    assert rows[5][2:] == ["0.59x", "0.59x", "5.11x", "5.11x"]
    assert rows[2][2:] == ["1.25x", "1.25x", "0.50x", "0.50x"]


def test_prompts_are_distinct_and_fixed_by_the_seed(bench: ModuleType) -> None:
    a = bench.make_prompts(32, seed=3)
    assert len(set(a)) == 32 and a == bench.make_prompts(32, seed=3)
    assert a != bench.make_prompts(32, seed=4)
