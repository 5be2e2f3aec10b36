"""Chat `logprobs` / `top_logprobs` through the official `openai` client: each token's
log-probability and alternatives equal a log-softmax computed here from a direct forward of the
artifact (every position's logits), streamed the same as whole, and bad values are 400s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .conftest import Running
from .direct import all_logits, greedy, log_softmax

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")

TOL = 1e-4
MESSAGES = [{"role": "user", "content": "Hello there, tiny model"}]
STEPS = 8


def chat(srv: Running, **kw: Any) -> Any:
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    kw = {"temperature": 0, "max_tokens": STEPS, **kw}
    return c.chat.completions.create(model=srv.model.name, messages=MESSAGES, **kw)


def expected(srv: Running, art: Path) -> tuple[list[int], np.ndarray]:
    """The greedy ids of the chat and the log-softmax rows that predicted each."""
    text = srv.model.render_chat(MESSAGES)
    prompt = srv.model.tokenizer.encode(text, add_special_tokens=False)
    ids = greedy(art, prompt, STEPS, srv.model.eos_ids)
    rows = log_softmax(all_logits(art, [*prompt, *ids]))[len(prompt) - 1 : -1]
    return ids, rows


def test_chat_logprobs(served: Running, full_artifact: Path) -> None:
    ids, rows = expected(served, full_artifact)
    got = chat(served, logprobs=True)
    choice = got.choices[0]
    content = choice.logprobs.content
    assert len(content) == len(ids) == got.usage.completion_tokens
    assert "".join(e.token for e in content) == choice.message.content
    for e, tok, row in zip(content, ids, rows):
        assert e.logprob == pytest.approx(row[tok], abs=TOL)
        assert e.logprob == pytest.approx(row.max(), abs=TOL)  # greedy: the top token
        assert e.bytes == list(e.token.encode("utf-8")) and e.top_logprobs == []
    assert chat(served).choices[0].logprobs is None  # not asked: none
    # an end token has no entry (it is not content): forced first with logit_bias
    eos = str(served.model.eos_ids[0])
    ended = chat(served, logprobs=True, logit_bias={eos: 100}).choices[0]
    assert ended.finish_reason == "stop" and ended.message.content == ""
    assert ended.logprobs.content == []
    assert chat(served, logprobs=False).choices[0].logprobs is None


def test_chat_top_logprobs(served: Running, full_artifact: Path) -> None:
    ids, rows = expected(served, full_artifact)
    content = chat(served, logprobs=True, top_logprobs=3).choices[0].logprobs.content
    assert len(content) == len(ids)
    for e, tok, row in zip(content, ids, rows):
        best = np.argsort(-row, kind="stable")[:3]
        assert best[0] == tok  # greedy: the chosen token is the top one
        got = [a.logprob for a in e.top_logprobs]
        np.testing.assert_allclose(got, row[best], atol=TOL)
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
        assert [a.token for a in e.top_logprobs] == [served.model.decode_special([b]) for b in best]
    for kw, param in (
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"extra_body": {"echo": True}}, "echo"),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            chat(served, **kw)
        assert exc.value.param == param, (kw, exc.value)


def test_chat_logprobs_stream(served: Running) -> None:
    whole = chat(served, logprobs=True, top_logprobs=2).choices[0]
    stream = chat(served, logprobs=True, top_logprobs=2, stream=True)
    entries, text = [], ""
    for ch in stream:
        if not ch.choices:
            continue
        c = ch.choices[0]
        text += c.delta.content or ""
        if c.logprobs is not None:
            assert "".join(e.token for e in c.logprobs.content) == (c.delta.content or "")
            entries += c.logprobs.content
    assert text == whole.message.content
    assert [e.model_dump() for e in entries] == [e.model_dump() for e in whole.logprobs.content]
    eos = str(served.model.eos_ids[0])
    stream = chat(served, logprobs=True, logit_bias={eos: 100}, stream=True)
    assert [c.logprobs for ch in stream for c in ch.choices if c.logprobs is not None] == []


def _flat(entries: list[Any]) -> list[tuple[str, float]]:
    """(token, logprob) of each entry and its alternatives, in order."""
    out = []
    for e in entries:
        out += [(e.token, e.logprob)] + [(t.token, t.logprob) for t in e.top_logprobs]
    return out


def _same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> bool:
    """Equal tokens, log-probs within TOL (a batched forward sums in another order)."""
    return [t for t, _ in got] == [t for t, _ in want] and all(
        abs(a - b) <= TOL for (_, a), (_, b) in zip(got, want)
    )


def test_chat_logprobs_of_n_choices(served: Running) -> None:
    """With n > 1 every choice carries its own entries (whole and streamed): greedy choices
    equal the n=1 answer's."""
    want = _flat(chat(served, logprobs=True, top_logprobs=2).choices[0].logprobs.content)
    assert want
    got = chat(served, logprobs=True, top_logprobs=2, n=2)
    assert [c.index for c in got.choices] == [0, 1]
    for c in got.choices:
        assert _same(_flat(c.logprobs.content), want)
    entries: dict[int, list[Any]] = {0: [], 1: []}
    for ch in chat(served, logprobs=True, top_logprobs=2, n=2, stream=True):
        for c in ch.choices:
            if c.logprobs is not None:
                entries[c.index] += c.logprobs.content
    assert _same(_flat(entries[0]), want) and _same(_flat(entries[1]), want)
