"""Sampling parameters through the official `openai` client: each one changes the answer the
way a reference written here says (a greedy loop over the artifact's logits, computed directly
with every position's logits, the parameter applied in numpy), and a bad value is a 400 that
names it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .conftest import Running
from .direct import all_logits

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")

PROMPT = [40, 75, 72, 3, 81, 88, 79, 67, 3]
STEPS = 12
Adjust = Callable[[np.ndarray, list[int]], np.ndarray]  # (logits, generated so far) -> logits


def client(srv: Running) -> Any:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def complete(srv: Running, **kw: Any) -> str:
    """The greedy completion of PROMPT (token ids) with the parameters kw."""
    kw = {"temperature": 0, "max_tokens": STEPS, **kw}
    got = client(srv).completions.create(model=srv.model.name, prompt=PROMPT, **kw)
    return str(got.choices[0].text)


def reference(srv: Running, art: Path, adjust: Adjust | None = None) -> list[int]:
    """Greedy ids after PROMPT: argmax of adjust(logits of the whole sequence's last row)."""
    out: list[int] = []
    for _ in range(STEPS):
        x = np.asarray(all_logits(art, [*PROMPT, *out])[-1], dtype=np.float64)
        tok = int(np.argmax(adjust(x, out) if adjust else x))
        if tok in srv.model.eos_ids:
            break
        out.append(tok)
    return out


def refused(srv: Running, param: str, **kw: Any) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        complete(srv, **kw)
    assert exc.value.param == param and exc.value.status_code == 400, exc.value


def test_logit_bias(served: Running, full_artifact: Path) -> None:
    greedy = reference(served, full_artifact)
    forced = next(t for t in (90, 91, 92) if t not in greedy[:1])
    assert complete(served, logit_bias={str(forced): 100}) == served.model.decode([forced] * STEPS)
    # -100 on the greedy first token: the answer changes, as the reference says
    ban = greedy[0]

    def banned(x: np.ndarray, gen: list[int]) -> np.ndarray:
        x[ban] -= 100
        return x

    want = reference(served, full_artifact, banned)
    assert want[0] != greedy[0] and ban not in want
    assert complete(served, logit_bias={str(ban): -100}) == served.model.decode(want)
    refused(served, "logit_bias", logit_bias={str(ban): 101})
    refused(served, "logit_bias", logit_bias={"a token": 1})
    refused(served, "logit_bias", logit_bias={str(served.model.decoder.vocab): 1})


def penalised(presence: float, frequency: float) -> Adjust:
    """OpenAI's formula over the generated tokens only."""

    def adjust(x: np.ndarray, gen: list[int]) -> np.ndarray:
        for tok, n in Counter(gen).items():
            x[tok] -= n * frequency + (n > 0) * presence
        return x

    return adjust


def test_presence_penalty(served: Running, full_artifact: Path) -> None:
    greedy = reference(served, full_artifact)
    assert len(set(greedy)) < len(greedy), "the tiny model's greedy answer repeats a token"
    want = reference(served, full_artifact, penalised(2.0, 0.0))
    assert want != greedy and len(set(want)) > len(set(greedy))
    assert complete(served, presence_penalty=2.0) == served.model.decode(want)
    refused(served, "presence_penalty", presence_penalty=2.5)


def test_frequency_penalty(served: Running, full_artifact: Path) -> None:
    greedy = reference(served, full_artifact)
    worst = max(Counter(greedy).values())
    assert worst >= 2, greedy  # the tiny model repeats itself under greedy
    want = reference(served, full_artifact, penalised(0.0, 2.0))
    assert max(Counter(want).values()) < worst  # the large penalty stops the repeat
    assert complete(served, frequency_penalty=2.0) == served.model.decode(want)
    refused(served, "frequency_penalty", frequency_penalty=-2.01)


def test_top_k(served: Running, full_artifact: Path) -> None:
    greedy = served.model.decode(reference(served, full_artifact))
    sampled = {complete(served, temperature=1.0, seed=s) for s in range(4)}
    assert sampled != {greedy}  # temperature 1 alone wanders off the greedy path
    for s in range(4):
        assert complete(served, temperature=1.0, seed=s, extra_body={"top_k": 1}) == greedy
    # -1 and 0 turn it off (vLLM's convention)
    for off in (-1, 0):
        same = complete(served, temperature=1.0, seed=5, extra_body={"top_k": off})
        assert same == complete(served, temperature=1.0, seed=5)
    refused(served, "top_k", extra_body={"top_k": -2})
    refused(served, "top_k", extra_body={"top_k": 1.5})


def test_min_p(served: Running, full_artifact: Path) -> None:
    greedy = served.model.decode(reference(served, full_artifact))
    assert {complete(served, temperature=1.0, seed=s) for s in range(4)} != {greedy}
    for s in range(4):
        assert complete(served, temperature=1.0, seed=s, extra_body={"min_p": 1.0}) == greedy
    refused(served, "min_p", extra_body={"min_p": 1.5})


def test_repetition_penalty(served: Running, full_artifact: Path) -> None:
    greedy = reference(served, full_artifact)
    r = 3.0

    def ctrl(x: np.ndarray, gen: list[int]) -> np.ndarray:
        for tok in set(PROMPT) | set(gen):  # the prompt's tokens count too
            x[tok] = x[tok] / r if x[tok] > 0 else x[tok] * r
        return x

    want = reference(served, full_artifact, ctrl)
    assert want != greedy
    got = complete(served, extra_body={"repetition_penalty": r})
    assert got == served.model.decode(want)
    refused(served, "repetition_penalty", extra_body={"repetition_penalty": 0})
