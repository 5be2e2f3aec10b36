"""Token sampling: logit bias, penalties, greedy or temperature / top-k / top-p / min-p, seeded.

`Sampler.pick(logits, history)` takes the last position's logits (1-D) and the ids of the
sequence so far (prompt and generated); the same seed and inputs give the same ids. One
`Sampler` serves one sequence: it counts the tokens it picked, which are the generated ones
the presence and frequency penalties look at.

The order of one pick, on float64 logits x:

1. `logit_bias`: x[j] += bias[j] (OpenAI's, on the raw logits);
2. `repetition_penalty` r (CTRL-style, over every id of `history`, prompt included): a seen
   token's positive logit is divided by r, a negative one multiplied;
3. `presence_penalty` / `frequency_penalty` (OpenAI's formula): x[j] -= c[j] * frequency +
   (c[j] > 0) * presence, c[j] = how many times j was generated so far (not the prompt);
4. temperature 0: the argmax of x (greedy); else x / temperature, then `top_k` (the k largest,
   ties at the k-th kept), softmax, `top_p` (the smallest likeliest set of mass >= top_p),
   `min_p` (tokens with p >= min_p * max p), and a draw from what is left.

Each step costs numpy work over the vocabulary and Python work over the distinct generated ids
only (the penalties' counts), never a Python loop over the vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llmir_core.errors import InputError


def _finite(v: float) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 => greedy
    top_k: int = 0  # 0 => off
    top_p: float = 1.0  # 1 => off
    repetition_penalty: float = (
        1.0  # 1 => off (CTRL-style: divide positive logits, multiply negative)
    )
    seed: int | None = None
    min_p: float = 0.0  # 0 => off
    presence_penalty: float = 0.0  # 0 => off
    frequency_penalty: float = 0.0  # 0 => off
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit

    def validate(self) -> None:
        if self.temperature < 0:
            raise InputError(
                f"--temperature must be >= 0, got {self.temperature}",
                hint="0 picks the most likely token (greedy); 0.7 to 1.0 samples",
            )
        if self.top_k < 0:
            raise InputError(
                f"--top-k must be >= 0, got {self.top_k}",
                hint="0 turns top-k off; 40 keeps the 40 most likely tokens",
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(
                f"--top-p must be in (0, 1], got {self.top_p}",
                hint="1 turns top-p off; 0.9 keeps the tokens making up 90% of the probability",
            )
        if self.repetition_penalty <= 0:
            raise InputError(
                f"--repetition-penalty must be > 0, got {self.repetition_penalty}",
                hint="1 turns it off; 1.1 to 1.3 discourages repeats",
            )
        if not (_finite(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise InputError(
                f"--min-p must be in [0, 1], got {self.min_p}",
                hint="0 turns min-p off; 0.05 drops tokens under 5% of the likeliest one's "
                "probability",
            )
        for flag, v in (
            ("--presence-penalty", self.presence_penalty),
            ("--frequency-penalty", self.frequency_penalty),
        ):
            if not (_finite(v) and -2.0 <= v <= 2.0):
                raise InputError(
                    f"{flag} must be in [-2, 2], got {v}",
                    hint="0 turns it off; 0.5 to 1 discourages repeating generated tokens",
                )
        for tok, b in self.logit_bias.items():
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0 or not _finite(b):
                raise InputError(
                    f"logit bias {tok!r}: {b!r} needs a token id >= 0 and a finite bias",
                    hint="map token ids to numbers, e.g. {50256: -100}",
                )


@dataclass
class Sampler:
    config: SamplingConfig
    rng: np.random.Generator = field(init=False)
    counts: dict[int, int] = field(init=False)  # times each token was picked (generated)

    def __post_init__(self) -> None:
        c = self.config
        c.validate()
        self.rng = np.random.default_rng(c.seed)
        self.counts = {}
        self._bias_ids = np.fromiter(c.logit_bias.keys(), np.int64, len(c.logit_bias))
        self._bias = np.fromiter(c.logit_bias.values(), np.float64, len(c.logit_bias))

    def pick(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        c = self.config
        if c.temperature == 0.0:
            tok = int(np.argmax(self.adjusted(logits, history)))
        else:
            ids, q = self._candidates(self.adjusted(logits, history) / c.temperature)
            draw = int(self.rng.choice(q.size, p=q))  # in index order, as over all of p
            tok = draw if ids is None else int(ids[draw])
        if c.presence_penalty or c.frequency_penalty:
            self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok

    def adjusted(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The logits after logit_bias, the repetition penalty and the presence / frequency
        penalties (steps 1-3 of the module docstring), a new float64 array."""
        x = np.array(logits, dtype=np.float64)
        c = self.config
        if self._bias_ids.size:
            if int(self._bias_ids.max()) >= x.size:
                raise InputError(
                    f"logit bias names token {int(self._bias_ids.max())}, outside the "
                    f"vocabulary of {x.size}"
                )
            x[self._bias_ids] += self._bias
        if c.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            vals = x[seen]
            x[seen] = np.where(vals > 0, vals / c.repetition_penalty, vals * c.repetition_penalty)
        if self.counts:
            ids = np.fromiter(self.counts.keys(), np.int64, len(self.counts))
            n = np.fromiter(self.counts.values(), np.float64, len(self.counts))
            x[ids] -= n * c.frequency_penalty + c.presence_penalty
        return x

    def probs(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The distribution a pick at temperature > 0 draws from (step 4 of the module
        docstring): softmax of the adjusted logits / temperature, after top-k, top-p, min-p."""
        ids, q = self._candidates(self.adjusted(logits, history) / self.config.temperature)
        if ids is None:
            return q
        p = np.zeros(np.asarray(logits).size)
        p[ids] = q
        return p

    def _candidates(self, x: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """The tokens left after top-k, top-p and min-p (ascending ids; None: all of them)
        and their probabilities. After top-k the work is over its k tokens only."""
        c = self.config
        ids = None
        if 0 < c.top_k < x.size:
            kth = np.partition(x, -c.top_k)[-c.top_k]
            ids = np.flatnonzero(x >= kth)  # ties at the k-th value kept
            x = x[ids]
        x = x - np.max(x)
        q = np.exp(x)
        q /= q.sum()
        if c.top_p < 1.0:
            order = np.argsort(-q, kind="stable")
            cum = np.cumsum(q[order])
            keep = np.zeros(q.size, dtype=bool)
            keep[order[cum - q[order] < c.top_p]] = True  # the smallest prefix reaching top_p
            ids, q = self._keep(ids, q, keep)
        if c.min_p > 0.0:
            ids, q = self._keep(ids, q, q >= c.min_p * q.max())
        return ids, q

    @staticmethod
    def _keep(
        ids: np.ndarray | None, q: np.ndarray, keep: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        q = q[keep]
        return (np.flatnonzero(keep) if ids is None else ids[keep]), q / q.sum()
