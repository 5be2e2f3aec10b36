"""Continuous batching: batched greedy decoding equals decoding alone; joins, cancellation, load."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from llmir_core.runtime.batch_decoder import SerialBatchDecoder
from llmir_core.runtime.sampling import Sampler, SamplingConfig
from llmir_core.runtime.textgen import TextGenerator, TextGenOptions
from llmir_core.serve.scheduler import Completion, GenRequest, QueueFull, Scheduler
from llmir_core.targets.onnxruntime.batch_runner import OrtBatchDecoder
from llmir_core.targets.onnxruntime.runner import open_decoder

from .conftest import Running, start_server

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, *range(30, 50)], [1, 50, 51, 52, 53], [1, 60]]


class _Ids:
    """A codec for prompts given as token ids (the text does not matter here)."""

    def encode(self, text: str) -> list[int]:
        return []

    def decode(self, ids: Sequence[int]) -> str:
        return ""


def alone(art: Path, ids: list[int], n: int) -> list[int]:
    """The greedy ids `llmir run` generates for this prompt: one sequence, whole-prompt prefill."""
    from llmir_core.runtime.generate import generate

    dec = open_decoder(str(art), 1)
    dec.reserve(len(ids) + n)
    return generate(dec, _Ids(), ids, max_new_tokens=n, sampler=Sampler(SamplingConfig())).ids


def run_all(
    sched: Scheduler,
    prompts: list[list[int]],
    n: int,
    start: bool = False,
) -> list[Completion]:
    """Submit every prompt (then start the scheduler when `start`) and wait for all of them."""
    done: dict[int, Completion] = {}
    ev = threading.Event()

    def finished(i: int, r: object) -> None:
        assert isinstance(r, Completion), r
        done[i] = r
        if len(done) == len(prompts):
            ev.set()

    for i, p in enumerate(prompts):
        done_i = functools.partial(finished, i)
        sched.submit(GenRequest(p, n, Sampler(SamplingConfig()), lambda s: None, done_i))
    if start:
        sched.start()
    assert ev.wait(60), "the scheduler hung"
    return [done[i] for i in range(len(prompts))]


def test_batched_greedy_equals_alone(tiny_artifact: Path) -> None:
    want = [alone(tiny_artifact, p, 10) for p in PROMPTS]
    dec = OrtBatchDecoder(str(tiny_artifact), 3, threads=1)
    sched = Scheduler(dec, lambda ids: "", chunk=4)  # chunked prefill, 5 requests on 3 slots
    # all five wait before the loop starts, so the schedule does not depend on thread timing:
    # three are admitted at once and the second decodes beside the first from its second step
    got = run_all(sched, PROMPTS, 10, start=True)
    sched.close()
    assert sched.join(10)
    assert [r.token_ids for r in got] == want
    assert sched.max_batch_seen >= 2  # some steps decoded several sequences at once
    assert sorted(sched.free) == [0, 1, 2] and not sched.active


def test_any_decoder_plugs_in(tiny_artifact: Path) -> None:
    """A target with only the single-sequence Decoder protocol serves through SerialBatchDecoder."""
    want = [alone(tiny_artifact, p, 6) for p in PROMPTS[:3]]
    dec = SerialBatchDecoder(
        lambda: open_decoder(str(tiny_artifact), 1), 2, vocab=128, max_context=256
    )
    sched = Scheduler(dec, lambda ids: "", chunk=5)
    sched.start()
    assert [r.token_ids for r in run_all(sched, PROMPTS[:3], 6)] == want
    sched.close()
    assert sched.join(10)


def test_queue_bound_and_prompt_limit(tiny_artifact: Path) -> None:
    dec = OrtBatchDecoder(str(tiny_artifact), 1, threads=1, max_context=32)
    sched = Scheduler(dec, lambda ids: "", max_queue=1)  # not started: nothing is admitted
    mk = lambda: GenRequest([1, 2], 4, Sampler(SamplingConfig()), lambda s: None, lambda r: None)  # noqa: E731
    sched.submit(mk())
    sched.submit(mk())  # one slot free + one queue place
    with pytest.raises(QueueFull):
        sched.submit(mk())
    with pytest.raises(ValueError, match="context is 32"):
        sched.submit(
            GenRequest([1] * 32, 4, Sampler(SamplingConfig()), lambda s: None, lambda r: None)
        )


def _rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists("/proc/self/statm"), reason="needs /proc to read the memory in use"
)
def test_load_32_streaming_clients(tiny_artifact: Path) -> None:
    """32 concurrent streaming clients, 16 tokens each: every one completes or gets 429, greedy
    outputs equal the sequential ones, the slots all come back and memory returns to idle."""
    openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")
    srv = start_server(tiny_artifact, max_batch=8, max_queue=16, chunk=8)
    prompts = [f"client {i} says" for i in range(32)]
    gen = TextGenerator(str(tiny_artifact), TextGenOptions(threads=1, max_new_tokens=16))
    want = {p: gen.generate(p).result.text for p in prompts}

    async def one(c: Any, p: str) -> str | BaseException | None:
        """The streamed text, None for a 429, or what else went wrong (counted below)."""
        try:
            stream = await c.completions.create(
                model=srv.model.name, prompt=p, max_tokens=16, temperature=0, stream=True
            )
            return "".join([ch.choices[0].text async for ch in stream if ch.choices])
        except openai.RateLimitError:
            return None
        except Exception as exc:  # noqa: BLE001 - counted and reported by the assertion
            return exc

    async def wave() -> list[str | BaseException | None]:
        async with openai.AsyncOpenAI(
            base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60
        ) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, p) for p in prompts)), 120)

    try:
        asyncio.run(wave())  # warm-up: allocator pools, bindings for every batch size, client
        gc.collect()
        idle = _rss()
        got = asyncio.run(wave())
        done = [p for p, t in zip(prompts, got) if isinstance(t, str) and t == want[p]]
        wrong = [p for p, t in zip(prompts, got) if isinstance(t, str) and t != want[p]]
        limited = [p for p, t in zip(prompts, got) if t is None]
        failed = [repr(t)[:80] for t in got if isinstance(t, BaseException)]
        counts = (
            f"{len(done)} completed, {len(limited)} got 429, {len(wrong)} streamed other text "
            f"than the sequential run, {len(failed)} failed otherwise {failed[:3]}"
        )
        # every stream completes with the sequential text or is refused with a 429, and at
        # least the 8 slots are served
        assert len(done) + len(limited) == len(prompts) and len(done) >= 8, counts
        assert srv.model.scheduler.max_batch_seen > 1
        deadline = time.monotonic() + 10
        while srv.model.scheduler.active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not srv.model.scheduler.active and len(srv.model.scheduler.free) == 8
        gc.collect()
        grew = _rss() - idle
        print(f"RSS after load - idle: {grew / 2**20:.1f} MiB")
        assert grew < 8 << 20, f"memory grew by {grew >> 20} MiB"
    finally:
        srv.stop()


def test_disconnect_frees_the_slot(served: Running) -> None:
    import http.client
    import json

    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {
        "model": served.model.name,
        "prompt": "go on",
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
    }
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.readline()  # the first event: generation is under way
    sched = served.model.scheduler
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 10
    while (sched.active or len(sched.free) != sched.decoder.slots) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sched.active and len(sched.free) == sched.decoder.slots


class Recording:
    """A BatchDecoder that logs its calls (prefill chunk sizes, decode batches)."""

    def __init__(self, inner: OrtBatchDecoder) -> None:
        self.inner = inner
        self.slots, self.max_context, self.vocab = inner.slots, inner.max_context, inner.vocab
        self.calls: list[tuple[str, int]] = []

    def prefill(self, slot: int, ids: list[int], start: int) -> object:
        self.calls.append(("prefill", len(ids)))
        return self.inner.prefill(slot, ids, start)

    def decode(self, slots: list[int], ids: list[int], positions: list[int]) -> object:
        self.calls.append(("decode", len(slots)))
        return self.inner.decode(slots, ids, positions)


def test_chunked_prefill_never_stalls_decoding_for_more_than_a_chunk(tiny_artifact: Path) -> None:
    dec = Recording(OrtBatchDecoder(str(tiny_artifact), 2, threads=1))
    sched = Scheduler(dec, lambda ids: "x" * len(ids), chunk=8)  # type: ignore[arg-type]
    # both wait before the loop starts, so the order is fixed whatever the machine's load: a
    # (oldest, nothing decoding) is prefilled whole, then the newcomer's chunks alternate with a's
    # decode steps
    a = GenRequest([1, 5, 6], 40, Sampler(SamplingConfig()), lambda s: None, lambda r: None)
    long_prompt = [1, *range(3, 60)]  # 58 tokens: 8 chunks
    done: list[Completion] = []
    ev = threading.Event()

    def finished(r: object) -> None:
        assert isinstance(r, Completion), r
        done.append(r)
        ev.set()

    b = GenRequest(long_prompt, 4, Sampler(SamplingConfig()), lambda s: None, finished)
    sched.submit(a)
    sched.submit(b)
    sched.start()
    assert ev.wait(60), "the scheduler hung"
    res = done
    assert res[0].token_ids == alone(tiny_artifact, long_prompt, 4)
    sched.close()
    assert sched.join(30)
    chunks = [i for i, (kind, n) in enumerate(dec.calls) if kind == "prefill" and n <= 8 and i > 0]
    assert len(chunks) >= 7
    for i in chunks[
        :-1
    ]:  # while a decodes, each chunk of the newcomer is followed by a decode step
        assert dec.calls[i + 1][0] == "decode", dec.calls
