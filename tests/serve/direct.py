"""Log-probabilities computed directly from an artifact, independently of the server: one
forward of the whole sequence through an artifact with every position's logits, a numpy
log-softmax, the chosen tokens' entries."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np


@functools.cache
def _decoder(art: Path) -> Any:
    from llmir_core.targets.onnxruntime.runner import open_decoder

    return open_decoder(str(art), threads=1)


def all_logits(art: Path, ids: list[int]) -> np.ndarray:
    """logits [len(ids), vocab] of one forward of ids (art built with every position's logits)."""
    dec = _decoder(art)
    dec.reset(1)
    out = np.asarray(dec.forward(np.asarray([ids], dtype=np.int64)))[0]
    assert out.shape[0] == len(ids), "the artifact keeps only the last position's logits"
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    """An independent numpy log-softmax (the serve and scoring code have their own)."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def token_logprobs(art: Path, ids: list[int]) -> np.ndarray:
    """log P(ids[i] | ids[:i]) for i in 1..len(ids)-1, as `llmir eval` computes them
    (llmir_core/runtime/scoring.py over one whole-sequence forward)."""
    from llmir_core.runtime import scoring

    rows = scoring.token_logprobs(_decoder(art), ids)
    assert rows.shape[0] == len(ids), "the artifact keeps only the last position's logits"
    return scoring.chosen_logprobs(rows, ids)


def greedy(art: Path, ids: list[int], steps: int, eos: tuple[int, ...] = ()) -> list[int]:
    """The greedy continuation of ids (argmax of a whole-sequence forward at each step)."""
    out: list[int] = []
    for _ in range(steps):
        tok = int(all_logits(art, [*ids, *out])[-1].argmax())
        if tok in eos:
            break
        out.append(tok)
    return out
