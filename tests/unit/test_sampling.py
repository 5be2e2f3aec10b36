"""`Sampler` against a plain reference written here: each step of the module docstring, one
token at a time in Python (logit_bias, repetition penalty, presence / frequency penalties over
the generated tokens, temperature, top-k, top-p, min-p)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.sampling import Sampler, SamplingConfig


def reference(
    logits: list[float], prompt: list[int], generated: list[int], c: SamplingConfig
) -> list[float]:
    """The adjusted logits (temperature 0) or the distribution a pick draws from."""
    x = [float(v) for v in logits]
    for j, b in c.logit_bias.items():
        x[j] += b
    for j in set(prompt) | set(generated):
        x[j] = x[j] / c.repetition_penalty if x[j] > 0 else x[j] * c.repetition_penalty
    for j, n in Counter(generated).items():
        x[j] -= n * c.frequency_penalty + c.presence_penalty
    if c.temperature == 0:
        return x
    x = [v / c.temperature for v in x]
    if c.top_k:
        kth = sorted(x, reverse=True)[c.top_k - 1]
        x = [v if v >= kth else -math.inf for v in x]
    m = max(x)
    e = [math.exp(v - m) for v in x]
    p = [v / sum(e) for v in e]
    order = sorted(range(len(p)), key=lambda j: -p[j])
    mass, keep = 0.0, set()
    for j in order:
        if mass >= c.top_p:
            break
        keep.add(j)
        mass += p[j]
    p = [v if j in keep else 0.0 for j, v in enumerate(p)]
    p = [v if v >= c.min_p * max(p) else 0.0 for v in p]
    return [v / sum(p) for v in p]


RNG = np.random.default_rng(3)
LOGITS = RNG.normal(0, 2, size=(6, 12))  # six steps over a vocabulary of 12
PROMPT = [1, 4, 4]

CONFIGS = {
    "logit_bias": SamplingConfig(logit_bias={2: 3.5, 7: -100.0, 0: 0.25}),
    "presence": SamplingConfig(presence_penalty=1.5),
    "frequency": SamplingConfig(frequency_penalty=0.8),
    "negative_penalties": SamplingConfig(presence_penalty=-0.5, frequency_penalty=-1.0),
    "repetition": SamplingConfig(repetition_penalty=1.7),
    "all_greedy": SamplingConfig(
        logit_bias={3: 1.0}, repetition_penalty=1.3, presence_penalty=0.7, frequency_penalty=0.4
    ),
    "top_k": SamplingConfig(temperature=0.8, top_k=4, seed=1),
    "top_p": SamplingConfig(temperature=1.3, top_p=0.7, seed=1),
    "min_p": SamplingConfig(temperature=1.0, min_p=0.2, seed=1),
    "all_sampled": SamplingConfig(
        temperature=0.9,
        top_k=8,
        top_p=0.9,
        min_p=0.05,
        logit_bias={5: 2.0},
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        seed=4,
    ),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_each_step_equals_the_reference(name: str) -> None:
    c = CONFIGS[name]
    s = Sampler(c)
    generated: list[int] = []
    for row in LOGITS:
        want = reference(list(row), PROMPT, generated, c)
        if c.temperature == 0:
            np.testing.assert_allclose(s.adjusted(row, [*PROMPT, *generated]), want, atol=1e-12)
        else:
            np.testing.assert_allclose(s.probs(row, [*PROMPT, *generated]), want, atol=1e-12)
        tok = s.pick(row, [*PROMPT, *generated])
        if c.temperature == 0:
            assert tok == int(np.argmax(want))
        else:
            assert want[tok] > 0
        generated.append(tok)


def test_the_penalties_count_generated_tokens_not_the_prompt() -> None:
    logits = np.array([2.0, 1.9, 0.0])
    s = Sampler(SamplingConfig(presence_penalty=0.5))
    assert s.pick(logits, [0, 0, 0]) == 0  # the prompt's 0s are not penalised
    assert s.pick(logits, [0, 0, 0, 0]) == 1  # the generated 0 is


def test_large_frequency_penalty_stops_a_greedy_repeat() -> None:
    logits = np.array([5.0, 1.0, 0.0, -1.0])
    plain = Sampler(SamplingConfig())
    assert [plain.pick(logits) for _ in range(4)] == [0, 0, 0, 0]
    s = Sampler(SamplingConfig(frequency_penalty=2.0))
    assert [s.pick(logits) for _ in range(4)] == [0, 0, 0, 1]


def test_min_p_one_and_top_k_one_are_greedy() -> None:
    for c in (
        SamplingConfig(temperature=1.5, min_p=1.0, seed=0),
        SamplingConfig(temperature=1.5, top_k=1, seed=0),
    ):
        s = Sampler(c)
        assert [s.pick(row) for row in LOGITS] == [int(np.argmax(row)) for row in LOGITS]


def test_logit_bias_outside_the_vocabulary_is_an_input_error() -> None:
    with pytest.raises(InputError, match="outside the vocabulary of 12"):
        Sampler(SamplingConfig(logit_bias={12: 1.0})).pick(LOGITS[0])


@pytest.mark.parametrize(
    "bad",
    [
        dict(min_p=-0.1),
        dict(min_p=1.5),
        dict(presence_penalty=2.5),
        dict(frequency_penalty=-3.0),
        dict(frequency_penalty=math.nan),
        dict(logit_bias={-1: 1.0}),
        dict(logit_bias={1: math.inf}),
    ],
)
def test_bad_values_are_input_errors(bad: dict[str, object]) -> None:
    with pytest.raises(InputError) as exc:
        Sampler(SamplingConfig(**bad))  # type: ignore[arg-type]
    assert exc.value.hint
