"""`n` choices per prompt through the official `openai` client, one prefill shared by the n
sequences (the scheduler forks the prompt's KV rows): indices, greedy and seeded choices,
streaming per index, the prompt prefilled once, refusals; the scheduler's groups directly."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from llmir_core.runtime.sampling import Sampler, SamplingConfig
from llmir_core.serve.choices import link_group
from llmir_core.serve.sampling_params import choice_seed
from llmir_core.serve.scheduler import Completion, GenRequest, Scheduler
from llmir_core.targets.onnxruntime.batch_runner import OrtBatchDecoder
from tests.decoder.reference_fixtures import ref_artifact, tiny_llmir  # noqa: F401  (fixtures)

from .conftest import Running, start_server
from .test_batching import alone

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")

PROMPT = "Once upon a time there was"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]


def client(served: Running) -> Any:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def _complete(served: Running, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 8)
    return client(served).completions.create(
        model=served.model.name, prompt=kw.pop("prompt", PROMPT), **kw
    )


def _chat(served: Running, **kw: Any) -> Any:
    return client(served).chat.completions.create(
        model=served.model.name, messages=MESSAGES, max_tokens=8, **kw
    )


def _texts(resp: Any, chat: bool) -> list[str]:
    assert [c.index for c in resp.choices] == list(range(len(resp.choices)))
    return [c.message.content if chat else c.text for c in resp.choices]


@pytest.mark.parametrize("chat", [False, True])
def test_n_choices(served: Running, chat: bool) -> None:
    ask = _chat if chat else _complete
    one = ask(served, temperature=0.0)
    greedy = ask(served, temperature=0.0, n=3)
    assert _texts(greedy, chat) == _texts(one, chat) * 3
    assert greedy.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert greedy.usage.completion_tokens == 3 * one.usage.completion_tokens
    if not chat:  # each forked choice's log-probs are those of the prompt prefilled alone
        want = _complete(served, temperature=0.0, logprobs=0).choices[0].logprobs.token_logprobs
        for c in _complete(served, temperature=0.0, logprobs=0, n=3).choices:
            assert c.logprobs.token_logprobs == pytest.approx(want, rel=1e-4, abs=1e-4)
    seeded = [_texts(ask(served, temperature=1.0, seed=11, n=3), chat) for _ in range(2)]
    assert seeded[0] == seeded[1]  # reproducible
    assert len(set(seeded[0])) > 1  # the choices sample with their own seeds
    # choice 0 samples with the request's seed: what n=1 answers
    assert seeded[0][0] == _texts(ask(served, temperature=1.0, seed=11), chat)[0]


def test_n_choices_of_several_prompts_are_prompt_major(served: Running) -> None:
    prompts = [PROMPT, "The cat sat"]
    alone_texts = [_complete(served, prompt=p, temperature=0.0).choices[0].text for p in prompts]
    got = _complete(served, prompt=prompts, temperature=0.0, n=2)
    assert _texts(got, False) == [alone_texts[0]] * 2 + [alone_texts[1]] * 2
    ones = [_complete(served, prompt=p, temperature=0.0).usage.prompt_tokens for p in prompts]
    assert got.usage.prompt_tokens == sum(ones)


def _reassemble(stream: Any, chat: bool, n: int) -> tuple[list[str], list[list[float]], Any]:
    """Per choice index: the text, the token log-probs (completions), and the usage chunk."""
    texts, lps, roles, usage = [""] * n, [[] for _ in range(n)], [0] * n, None
    for ch in stream:
        assert usage is None  # the usage chunk is the last
        if ch.usage is not None:
            assert not ch.choices
            usage = ch.usage
        for c in ch.choices:
            if chat:
                roles[c.index] += c.delta.role == "assistant"
                texts[c.index] += c.delta.content or ""
            else:
                texts[c.index] += c.text
                lps[c.index] += c.logprobs.token_logprobs if c.logprobs else []
    if chat:
        assert roles == [1] * n  # the first chunk of each choice has the role
    return texts, lps, usage


@pytest.mark.parametrize("chat", [False, True])
def test_n_stream(served: Running, chat: bool) -> None:
    ask = _chat if chat else _complete
    kw: dict[str, Any] = {} if chat else {"logprobs": 0}
    whole = ask(served, temperature=1.0, seed=5, n=3, **kw)
    stream = ask(served, temperature=1.0, seed=5, n=3, stream=True, **kw)
    texts, lps, usage = _reassemble(stream, chat, 3)
    assert texts == _texts(whole, chat)
    assert usage is not None and usage.total_tokens == whole.usage.total_tokens
    if not chat:
        assert lps == [c.logprobs.token_logprobs for c in whole.choices]


def _health(served: Running) -> dict[str, Any]:
    with urllib.request.urlopen(served.url + "/health", timeout=10) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def _prompt_tokens_total(served: Running) -> int:
    with urllib.request.urlopen(served.url + "/metrics", timeout=10) as r:
        found = re.search(r"^llmir_prompt_tokens_total (\d+)$", r.read().decode(), re.M)
    assert found
    return int(found.group(1))


def test_n_prefill_once(served: Running) -> None:
    shared, prefilled = _health(served)["prefill_shared"], _prompt_tokens_total(served)
    got = _complete(served, temperature=0.0, n=4)
    assert _prompt_tokens_total(served) - prefilled == got.usage.prompt_tokens  # not 4 x
    assert _health(served)["prefill_shared"] - shared == 3


def test_n_bad(served: Running) -> None:
    slots = served.model.scheduler.decoder.slots
    for n, fragment in ((0, "must be >= 1"), (129, "must be <= 128"), (slots + 1, "--max-batch")):
        for ask in (_complete, _chat):
            with pytest.raises(openai.BadRequestError) as err:
                ask(served, n=n)
            assert err.value.status_code == 400
            body = err.value.body
            assert body["param"] == "n" and body["code"] == "invalid_value", body
            assert fragment in body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        _complete(served, n=2, best_of=3)  # candidates beyond n: not generated
    assert err.value.body["param"] == "best_of"
    assert len(_complete(served, n=2, best_of=2).choices) == 2  # best_of == n: the n choices


def test_choice_seeds() -> None:
    assert choice_seed(None, 3) is None and choice_seed(7, 0) == 7
    seeds = {choice_seed(7, j) for j in range(1, 50)} | {choice_seed(8, 1)}
    assert len(seeds) == 50 and 7 not in seeds and choice_seed(7, 1) == choice_seed(7, 1)


def _group(prompt: list[int], n: int, max_tokens: int, done: dict[int, Any], at: int) -> GenRequest:
    reqs = []
    for j in range(n):
        reqs.append(
            GenRequest(
                prompt,
                max_tokens,
                Sampler(SamplingConfig()),
                lambda s: None,
                lambda r, k=at + j: done.__setitem__(k, r),
            )
        )
    return link_group(reqs)


def test_n_scheduler_groups_wait_for_their_slots(tiny_artifact: Path) -> None:
    """3 slots: a sequence, then a group of 3 (waits for the first to end), then one more;
    chunked prefill. Every greedy choice equals the prompt decoded alone; the group's prompt
    is prefilled once."""
    p0, p1, p2 = [1, 5, 6, 7, 8, 9, 10], [1, *range(30, 45)], [1, 20, 21]
    sched = Scheduler(OrtBatchDecoder(str(tiny_artifact), 3, threads=1), lambda ids: "", chunk=4)
    done: dict[int, Any] = {}
    sched.submit(_group(p0, 1, 6, done, 0))
    sched.submit(_group(p1, 3, 6, done, 1))
    sched.submit(_group(p2, 1, 6, done, 4))
    sched.start()
    deadline = time.monotonic() + 60
    while len(done) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    sched.close()
    assert sched.join(30) and len(done) == 5
    assert all(isinstance(r, Completion) for r in done.values())
    want = [alone(tiny_artifact, p, 6) for p in (p0, p1, p2)]
    assert [done[k].token_ids for k in range(5)] == [want[0], *[want[1]] * 3, want[2]]
    assert sched.prefill_shared == 2
    assert sched.metrics.prompt_tokens == len(p0) + len(p1) + len(p2)


def test_n_cancel_cancels_the_group(tiny_artifact: Path) -> None:
    sched = Scheduler(OrtBatchDecoder(str(tiny_artifact), 4, threads=1), lambda ids: "a" * len(ids))
    done: dict[int, Any] = {}
    lead = _group([1, 5, 6], 3, 50, done, 0)
    started = threading.Event()
    lead.group[1].on_text = lambda s: started.set()
    sched.submit(lead)
    sched.start()
    assert started.wait(30)
    sched.cancel(lead.group[1])  # a sibling: the whole group goes
    deadline = time.monotonic() + 30
    while sched.snapshot()["active"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(r.cancelled for r in (lead, *lead.group))
    assert sched.snapshot()["active"] == 0 and sorted(sched.free) == [0, 1, 2, 3]
    sched.close()
    assert sched.join(30)


def test_n_on_the_reference_target(ref_artifact: Path) -> None:  # noqa: F811
    """A SerialBatchDecoder (one interpreter decoder per slot) forks through its decoders:
    greedy choices and their log-probs are the single sequence's."""
    run = start_server(ref_artifact, max_batch=2, max_queue=4, chunk=4)
    try:
        one = _complete(run, temperature=0.0, logprobs=0, max_tokens=5)
        two = _complete(run, temperature=0.0, logprobs=0, max_tokens=5, n=2)
    finally:
        run.stop()
    assert _texts(two, False) == _texts(one, False) * 2
    want = one.choices[0].logprobs.token_logprobs
    for c in two.choices:
        assert c.logprobs.token_logprobs == pytest.approx(want, rel=1e-5, abs=1e-5)
