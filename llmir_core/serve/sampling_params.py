"""A request's sampling parameters as the `Sampler` of one of its sequences.

`sampling_config(p, index)` is the one place the server turns `GenParams` into a
`SamplingConfig` (temperature, top_p, top_k, min_p, the penalties, logit_bias, the seed);
`check_logit_bias(p, vocab)` refuses a bias on a token outside the model's vocabulary (400
naming `logit_bias`), once the model is known.
"""

from __future__ import annotations

import numpy as np

from llmir_core.runtime.sampling import SamplingConfig

from .schemas import GenParams, bad


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of a request's choice `index`: the request's own for choice 0 (so it samples
    what `llmir run --seed` does), one derived from (seed, index) for the others."""
    if seed is None or index == 0:
        return seed
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0])


def sampling_config(p: GenParams, index: int = 0) -> SamplingConfig:
    """The sampler's configuration for choice `index` (0..n-1) of one prompt of request p."""
    return SamplingConfig(
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        repetition_penalty=p.repetition_penalty,
        seed=choice_seed(p.seed, index),
        min_p=p.min_p,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        logit_bias=dict(p.logit_bias),
    )


def check_logit_bias(p: GenParams, vocab: int) -> None:
    out = next((t for t in p.logit_bias if t >= vocab), None)
    if out is not None:
        raise bad(
            "logit_bias", f"'logit_bias' names token {out}, outside the vocabulary [0, {vocab})"
        )


__all__ = ["sampling_config", "check_logit_bias", "choice_seed"]
