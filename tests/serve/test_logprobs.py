"""`/v1/completions` with `logprobs` and `echo`: the log-probabilities equal a direct
computation (one whole-sequence forward of the artifact built with every position's logits, a
numpy log-softmax), on both ways the server gets a prompt's logits: one forward per chunk
(`--logits all` artifact) and one forward per token (the default last-position artifact)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.serve.logprobs import legacy_logprobs, score

from .conftest import Running
from .direct import all_logits, greedy, log_softmax, token_logprobs
from .test_bad_input import call, expect

TOL = 1e-4
IDS = [40, 75, 72, 3, 81, 88, 79, 67, 3, 85, 72, 71, 3, 74, 82, 91, 3, 86, 68, 90, 17, 72]  # 22


def post(srv: Running, **body: Any) -> tuple[int, Any]:
    status, _, data = call(
        srv.url, "POST", "/v1/completions", json.dumps({"model": srv.model.name, **body})
    )
    return status, data


def ok(srv: Running, **body: Any) -> dict[str, Any]:
    status, data = post(srv, **body)
    assert status == 200, data
    return data  # type: ignore[no-any-return]


@pytest.fixture(params=["full", "last"])
def srv(request: pytest.FixtureRequest) -> Running:
    """The server on the `--logits all` artifact, or on the default last-position one."""
    srv: Running = request.getfixturevalue("served_full" if request.param == "full" else "served")
    return srv


def test_echo_logprobs_equal_a_direct_log_softmax(srv: Running, full_artifact: Path) -> None:
    data = ok(srv, prompt=IDS, echo=True, logprobs=3, max_tokens=1, temperature=0)
    (choice,) = data["choices"]
    lp = choice["logprobs"]
    n = len(IDS)
    assert len(lp["token_logprobs"]) == n + 1 and lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None
    rows = log_softmax(all_logits(full_artifact, IDS))
    want = [rows[i - 1, IDS[i]] for i in range(1, n)]
    np.testing.assert_allclose(lp["token_logprobs"][1:n], want, atol=TOL, rtol=0)
    # each top_logprobs dict: the 3 likeliest tokens of the row, by their text (char tokenizer)
    for i in range(1, n):
        best = np.argsort(-rows[i - 1], kind="stable")[:3]
        got = lp["top_logprobs"][i]
        assert len(got) == 3
        np.testing.assert_allclose(sorted(got.values()), sorted(rows[i - 1, best]), atol=TOL)
    # the generated token: the greedy one, with the last row's log-probability
    tok = int(rows[-1].argmax())
    assert lp["token_logprobs"][n] == pytest.approx(rows[-1, tok], abs=TOL)
    assert lp["token_logprobs"][n] == pytest.approx(max(lp["top_logprobs"][n].values()))
    text = srv.model.decode(IDS)
    assert choice["text"] == text + srv.model.decode([tok])
    assert lp["tokens"][:n] == [srv.model.decode_special([t]) for t in IDS]
    assert lp["text_offset"][:n] == list(np.cumsum([0] + [len(t) for t in lp["tokens"][:-2]]))
    assert data["usage"] == {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1}


def test_generated_logprobs_equal_the_logits_of_each_step(
    srv: Running, full_artifact: Path
) -> None:
    prompt = "Once upon a time"
    ids = srv.model.encode_text(prompt)
    gen = greedy(full_artifact, ids, 6, srv.model.eos_ids)
    data = ok(srv, prompt=prompt, logprobs=2, max_tokens=6, temperature=0)
    (choice,) = data["choices"]
    lp = choice["logprobs"]
    assert choice["text"] == srv.model.decode(gen)
    rows = log_softmax(all_logits(full_artifact, [*ids, *gen]))
    want = [rows[len(ids) - 1 + j, t] for j, t in enumerate(gen)]
    np.testing.assert_allclose(lp["token_logprobs"][: len(gen)], want, atol=TOL, rtol=0)
    for j in range(len(gen)):
        row = rows[len(ids) - 1 + j]
        assert max(lp["top_logprobs"][j].values()) == pytest.approx(row.max(), abs=TOL)
        assert len(lp["top_logprobs"][j]) == 2
    # tokens write special tokens out; the text and the offsets skip them
    special = srv.model.special_ids
    assert lp["tokens"][: len(gen)] == [srv.model.decode_special([t]) for t in gen]
    shown = [t for t, i in zip(lp["tokens"], gen) if i not in special]
    assert "".join(shown) == choice["text"]
    at = [o for o, i in zip(lp["text_offset"], gen) if i not in special]
    assert at == list(np.cumsum([0] + [len(t) for t in shown[:-1]]))


def test_batched_token_id_prompts(served_full: Running, full_artifact: Path) -> None:
    prompts = [IDS[:9], IDS[3:], IDS[:2]]
    data = ok(served_full, prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0)
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    for ids, choice in zip(prompts, data["choices"]):
        got = choice["logprobs"]["token_logprobs"]
        assert len(got) == len(ids) + 1
        np.testing.assert_allclose(got[1 : len(ids)], token_logprobs(full_artifact, ids), atol=TOL)
        alone = ok(served_full, prompt=ids, echo=True, logprobs=1, max_tokens=1, temperature=0)
        assert alone["choices"][0]["logprobs"] == choice["logprobs"]
        assert alone["choices"][0]["text"] == choice["text"]
    total = sum(len(p) for p in prompts)
    assert data["usage"]["prompt_tokens"] == total and data["usage"]["completion_tokens"] == 3


def test_echo_with_max_tokens_zero_and_without_logprobs(srv: Running, full_artifact: Path) -> None:
    prompt = "the cat sat"
    ids = srv.model.encode_text(prompt)
    data = ok(srv, prompt=prompt, echo=True, logprobs=0, max_tokens=0)
    (choice,) = data["choices"]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert lp["top_logprobs"] == [None] + [{}] * (len(ids) - 1)
    np.testing.assert_allclose(
        lp["token_logprobs"][1:], token_logprobs(full_artifact, ids), atol=TOL
    )
    assert data["usage"]["completion_tokens"] == 0
    # echo alone: the prompt, then the completion the same request gives without echo
    plain = ok(srv, prompt=prompt, max_tokens=4, temperature=0)["choices"][0]
    echoed = ok(srv, prompt=prompt, echo=True, max_tokens=4, temperature=0)["choices"][0]
    assert echoed["text"] == prompt + plain["text"] and echoed["logprobs"] is None


def stream(srv: Running, **body: Any) -> list[dict[str, Any]]:
    """The chunks of a streamed completion."""
    import urllib.request

    req = urllib.request.Request(
        srv.url + "/v1/completions",
        json.dumps({"model": srv.model.name, "stream": True, **body}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        lines = resp.read().decode().splitlines()
    data = [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_streamed_logprobs_equal_the_whole_answer(served: Running) -> None:
    body = {"prompt": "Once upon a time", "logprobs": 2, "max_tokens": 12, "temperature": 0}
    whole = ok(served, **body)["choices"][0]
    chunks = [c["choices"][0] for c in stream(served, **body)]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["finish_reason"] == whole["finish_reason"]
    got: dict[str, list[Any]] = {k: [] for k in whole["logprobs"]}
    for c in chunks:
        assert c["logprobs"] is not None
        for k, v in c["logprobs"].items():
            got[k] += v
    assert got == whole["logprobs"]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"logprobs": 21}, "invalid_value", "logprobs"),
        ({"logprobs": -1}, "invalid_value", "logprobs"),
        ({"logprobs": True}, "invalid_type", "logprobs"),
        ({"echo": "yes"}, "invalid_type", "echo"),
        ({"max_tokens": 0}, "invalid_value", "max_tokens"),
        ({"stream": True, "echo": True}, "unsupported_parameter", "echo"),
        ({"stream": True, "prompt": ["a", "b"]}, "unsupported_parameter", "prompt"),
        ({"n": 0}, "invalid_value", "n"),
        ({"best_of": 2}, "unsupported_parameter", "best_of"),
        ({"suffix": "end"}, "unsupported_parameter", "suffix"),
        ({"top_logprobs": 2}, "unsupported_parameter", "top_logprobs"),
        ({"prompt": [1, 2, 9999]}, "invalid_value", "prompt"),
        ({"prompt": [[1, 2], [-1]]}, "invalid_value", "prompt[1]"),
        ({"prompt": [[1, 2], []]}, "invalid_type", "prompt[1]"),
        ({"prompt": [[1, 2], 3]}, "invalid_type", "prompt[1]"),
        ({"prompt": []}, "invalid_type", "prompt"),
        ({"prompt": [1, True]}, "invalid_type", "prompt[0]"),
    ],
)
def test_bad_scoring_requests(served: Running, body: dict[str, Any], code: str, param: str) -> None:
    status, data = post(served, **{"prompt": "hi", **body})
    expect(status, data, 400, code, param)
    assert "\n" not in data["error"]["message"]


def test_more_prompts_than_the_server_holds(served: Running) -> None:
    room = served.model.decoder.slots + served.model.scheduler.max_queue
    status, data = post(served, prompt=[[5, 6]] * (room + 1), max_tokens=1)
    expect(status, data, 400, "invalid_value", "prompt")
    assert f"at most {room}" in data["error"]["message"]


def test_chat_refuses_echo(served: Running) -> None:
    m = served.model.name
    for extra in ({"echo": True},):
        body = {"model": m, "messages": [{"role": "user", "content": "hi"}], **extra}
        status, _, data = call(served.url, "POST", "/v1/chat/completions", json.dumps(body))
        expect(status, data, 400, "unsupported_parameter", next(iter(extra)))


def test_defaults_of_unused_parameters_are_accepted(served: Running) -> None:
    body = {"best_of": 1, "suffix": "", "logit_bias": {}, "presence_penalty": 0}
    data = ok(served, prompt="hi", max_tokens=2, echo=False, **body)
    assert data["choices"][0]["logprobs"] is None


def test_score_and_legacy_object() -> None:
    rows = np.array([[0.0, 1.0, 2.0], [3.0, 3.0, -1.0]], dtype=np.float32)
    got = score(rows, [0, 2], 2)
    want = log_softmax(rows)
    assert got[0].logprob == pytest.approx(want[0, 0]) and got[1].logprob == pytest.approx(
        want[1, 2]
    )
    assert [t for t, _ in got[0].top] == [2, 1] and [t for t, _ in got[1].top] == [0, 1]
    texts = {0: "<s>", 1: "a", 2: "b"}

    def decode(ids: list[int]) -> str:
        return "".join(texts[i] for i in ids)

    # prompt [0, 1] (0 special), generated 2: echoed text is "a" + "b"
    obj = legacy_logprobs(decode, {0}, [0, 1], score(rows[:1], [1], 1), score(rows[1:], [2], 1))
    assert obj["tokens"] == ["<s>", "a", "b"]
    assert obj["text_offset"] == [0, 0, 1]
    assert obj["token_logprobs"][0] is None and obj["top_logprobs"][0] is None
    assert obj["top_logprobs"][1] == {"b": pytest.approx(want[0, 2])}


def test_the_openai_client_reads_the_logprobs(served: Running) -> None:
    openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")
    c = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    got = c.completions.create(
        model=served.model.name, prompt=IDS[:6], echo=True, logprobs=2, max_tokens=1, temperature=0
    )
    raw = ok(served, prompt=IDS[:6], echo=True, logprobs=2, max_tokens=1, temperature=0)
    lp = got.choices[0].logprobs
    assert lp is not None
    assert lp.token_logprobs == raw["choices"][0]["logprobs"]["token_logprobs"]
    assert lp.top_logprobs == raw["choices"][0]["logprobs"]["top_logprobs"]
    assert lp.tokens == raw["choices"][0]["logprobs"]["tokens"]
