"""Sampling, the generation loop and the bench harness, on a toy decoder with a known answer."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.bench import run_bench
from llmir_core.runtime.decoder import CacheSpec, FunctionDecoder
from llmir_core.runtime.generate import generate
from llmir_core.runtime.sampling import Sampler, SamplingConfig

VOCAB = 16


def toy_call(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Next token = (last token + 1) % VOCAB, with a cache that records every token seen."""
    ids = feeds["input_ids"]
    past = feeds["past"]
    b, s = ids.shape
    logits = np.full((b, s, VOCAB), -5.0, np.float32)
    for j in range(s):
        logits[np.arange(b), j, (ids[:, j] + 1) % VOCAB] = 5.0
    present = np.concatenate([past, ids[:, None, :, None].astype(np.float32)], axis=2)
    return [logits, present]


class Chars:
    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def make_decoder(ctx: int | None = None) -> FunctionDecoder:
    return FunctionDecoder(toy_call, [CacheSpec("past", 1, 1, np.dtype(np.float32))], ctx)


def test_greedy_generation_streams_and_counts() -> None:
    pieces: list[str] = []
    res = generate(
        make_decoder(),
        Chars(),
        [0, 1, 2],
        max_new_tokens=5,
        sampler=Sampler(SamplingConfig()),
        on_text=pieces.append,
    )
    assert res.text == "defgh"
    assert "".join(pieces) == "defgh"
    assert res.ids == [3, 4, 5, 6, 7]
    assert res.stop_reason == "length"


def test_cache_grows_by_one_per_step() -> None:
    d = make_decoder()
    generate(d, Chars(), [0, 1], max_new_tokens=4, sampler=Sampler(SamplingConfig()))
    assert d.length == 2 + 3
    assert d.cache[0].shape == (1, 1, 5, 1)


def test_eos_and_stop_strings() -> None:
    res = generate(
        make_decoder(),
        Chars(),
        [0],
        max_new_tokens=10,
        sampler=Sampler(SamplingConfig()),
        eos_ids=[4],
    )
    assert res.text == "bcd" and res.stop_reason == "eos"
    pieces: list[str] = []
    res = generate(
        make_decoder(),
        Chars(),
        [0],
        max_new_tokens=10,
        sampler=Sampler(SamplingConfig()),
        stop=["de"],
        on_text=pieces.append,
    )
    assert res.text == "bc" and res.stop_reason == "stop_string"
    assert "".join(pieces) == "bc"


def test_context_limit_stops_with_reason() -> None:
    res = generate(
        make_decoder(ctx=6),
        Chars(),
        [0, 1, 2],
        max_new_tokens=10,
        sampler=Sampler(SamplingConfig()),
    )
    assert res.stop_reason == "context"
    assert len(res.ids) == 4


def test_prompt_longer_than_context_is_an_input_error() -> None:
    with pytest.raises(InputError, match="exceed the model's context"):
        generate(
            make_decoder(ctx=2),
            Chars(),
            [0, 1, 2],
            max_new_tokens=1,
            sampler=Sampler(SamplingConfig()),
        )


def test_same_seed_same_samples() -> None:
    logits = np.linspace(0, 1, 50)
    a = [Sampler(SamplingConfig(temperature=1.0, seed=7)).pick(logits) for _ in range(3)]
    s1 = Sampler(SamplingConfig(temperature=1.0, top_k=10, top_p=0.9, seed=7))
    s2 = Sampler(SamplingConfig(temperature=1.0, top_k=10, top_p=0.9, seed=7))
    assert [s1.pick(logits) for _ in range(20)] == [s2.pick(logits) for _ in range(20)]
    assert len(set(a)) == 1


def test_top_k_and_top_p_restrict_support() -> None:
    logits = np.array([0.0, 10.0, 9.0, 1.0])
    s = Sampler(SamplingConfig(temperature=1.0, top_k=2, seed=0))
    assert {s.pick(logits) for _ in range(200)} <= {1, 2}
    s = Sampler(SamplingConfig(temperature=1.0, top_p=0.5, seed=0))
    assert {s.pick(logits) for _ in range(200)} == {1}


def test_repetition_penalty_changes_greedy_choice() -> None:
    logits = np.array([1.0, 0.9, 0.0])
    assert Sampler(SamplingConfig()).pick(logits, [0]) == 0
    assert Sampler(SamplingConfig(repetition_penalty=2.0)).pick(logits, [0]) == 1


@pytest.mark.parametrize(
    "bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_k=-2), dict(repetition_penalty=0.0)]
)
def test_bad_sampling_flags(bad: dict[str, float]) -> None:
    with pytest.raises(InputError):
        Sampler(SamplingConfig(**bad))  # type: ignore[arg-type]


def test_bench_reports_all_metrics() -> None:
    res = run_bench(make_decoder(), VOCAB, prompt_len=8, gen_len=5, batch=2, runs=2, warmup=1)
    js = res.to_json()
    r = js["results"]
    assert js["config"]["runs"] == 2 and len(js["runs"]) == 2
    assert len(js["runs"][0]["itl_s"]) == 4
    assert (
        r["decode_tokens_per_s_aggregate"]["mean"] > 0 and r["itl_ms"]["p99"] >= r["itl_ms"]["p50"]
    )
    # batch 2: the whole batch decodes twice the tokens one sequence sees, in the same time
    per_seq, agg = r["decode_tokens_per_s_per_sequence"], r["decode_tokens_per_s_aggregate"]
    assert agg["mean"] == pytest.approx(2 * per_seq["mean"]) and per_seq["mean"] > 0
    assert per_seq["mean"] == pytest.approx(
        statistics.fmean(len(x["itl_s"]) / x["decode_s"] for x in js["runs"])
    )
    assert "decode_tokens_per_s" not in r  # the ambiguous name is gone (bench_schema 2)
    assert r["peak_rss_mb"] > 0
    assert js["fingerprint"]["cores"] >= 1 and "llmir" in js["fingerprint"]
