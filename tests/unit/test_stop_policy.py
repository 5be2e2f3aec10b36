"""The one stop policy (llmir_core.runtime.stop): `generate` and the serve scheduler end a
sequence at the same token for the same reason."""

from __future__ import annotations

import threading

import pytest

from llmir_core.runtime.batch_decoder import SerialBatchDecoder
from llmir_core.runtime.generate import generate
from llmir_core.runtime.sampling import Sampler, SamplingConfig
from llmir_core.runtime.stop import StopPolicy
from llmir_core.serve.scheduler import Completion, GenRequest, Scheduler

from .test_runtime_generate import VOCAB, Chars, make_decoder

PROMPT = [0, 1, 2]  # the toy decoder then generates 3, 4, 5, ... ("def...")


def _served(
    stop: tuple[str, ...], eos: tuple[int, ...], max_tokens: int, ctx: int | None
) -> Completion:
    batch = SerialBatchDecoder(lambda: make_decoder(ctx), 1, VOCAB, ctx or 1000)
    sched = Scheduler(batch, Chars().decode)
    done: list[Completion | BaseException] = []
    finished = threading.Event()

    def on_done(c: Completion | BaseException) -> None:
        done.append(c)
        finished.set()

    sched.start()
    sched.submit(
        GenRequest(
            list(PROMPT),
            max_tokens,
            Sampler(SamplingConfig()),
            lambda piece: None,
            on_done,
            stop=stop,
            eos_ids=eos,
        )
    )
    assert finished.wait(30)
    sched.close()
    sched.join(30)
    assert isinstance(done[0], Completion), done[0]
    return done[0]


@pytest.mark.parametrize(
    ("stop", "eos", "max_tokens", "ctx", "reason", "ids"),
    [
        (("fg",), (), 10, None, "stop_string", [3, 4, 5, 6]),  # "defg": cut before "fg"
        ((), (6,), 10, None, "eos", [3, 4, 5]),  # the eos id is not in the output
        (("zz",), (), 4, None, "length", [3, 4, 5, 6]),
        ((), (), 10, 6, "context", [3, 4, 5, 6]),  # 3 + 4 tokens would pass a context of 6
    ],
)
def test_generate_and_the_scheduler_stop_at_the_same_token(
    stop: tuple[str, ...],
    eos: tuple[int, ...],
    max_tokens: int,
    ctx: int | None,
    reason: str,
    ids: list[int],
) -> None:
    res = generate(
        make_decoder(ctx),
        Chars(),
        list(PROMPT),
        max_new_tokens=max_tokens,
        sampler=Sampler(SamplingConfig()),
        eos_ids=eos,
        stop=stop,
    )
    served = _served(stop, eos, max_tokens, ctx)
    assert (res.ids, res.stop_reason) == (ids, reason)
    assert (served.token_ids, served.stop_reason) == (ids, reason)
    assert served.text == res.text == ("de" if reason == "stop_string" else Chars().decode(ids))


def test_the_policy_s_order_eos_before_stop_strings_before_length() -> None:
    p = StopPolicy(Chars().decode, stop=["b"], eos_ids=[7], max_tokens=2, prompt_tokens=1)
    assert p.push(0) == ("a", None)
    assert p.push(7) == ("", "eos")
    assert p.generated == 1
    assert p.push(1) == ("", "stop_string")  # the 2nd token: the stop string wins over length
    assert p.text == "a"
    q = StopPolicy(Chars().decode, max_tokens=5, prompt_tokens=3, max_context=4)
    assert q.push(0) == ("a", None) and q.push(1) == ("b", "context")
