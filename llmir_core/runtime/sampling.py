"""Token sampling: greedy, temperature, top-k, top-p and repetition penalty, seeded.

`Sampler.pick(logits, history)` takes the last position's logits (1-D) and the ids generated so
far; the same seed and inputs give the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llmir_core.errors import InputError


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 => greedy
    top_k: int = 0  # 0 => off
    top_p: float = 1.0  # 1 => off
    repetition_penalty: float = (
        1.0  # 1 => off (CTRL-style: divide positive logits, multiply negative)
    )
    seed: int | None = None

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


@dataclass
class Sampler:
    config: SamplingConfig
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.config.validate()
        self.rng = np.random.default_rng(self.config.seed)

    def pick(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        x = np.asarray(logits, dtype=np.float64).copy()
        c = self.config
        if c.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            vals = x[seen]
            x[seen] = np.where(vals > 0, vals / c.repetition_penalty, vals * c.repetition_penalty)
        if c.temperature == 0.0:
            return int(np.argmax(x))
        x = x / c.temperature
        if 0 < c.top_k < x.size:
            kth = np.partition(x, -c.top_k)[-c.top_k]
            x[x < kth] = -np.inf
        x -= np.max(x)
        p = np.exp(x)
        p /= p.sum()
        if c.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = cum - p[order] < c.top_p  # the smallest prefix whose mass reaches top_p
            mask = np.zeros_like(p, dtype=bool)
            mask[order[keep]] = True
            p = np.where(mask, p, 0.0)
            p /= p.sum()
        return int(self.rng.choice(p.size, p=p))
