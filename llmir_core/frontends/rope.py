"""Rotary embedding frequencies for every rope type transformers defines for the imported families.

`rope_frequencies(rtype, p)` returns the float32 inverse frequencies, the attention factor that
multiplies cos and sin, and for `longrope` the long-context set with the position it starts at,
computed as transformers 5.x's `modeling_rope_utils` does (float32 throughout):

- `default`: 1 / theta^(2i/d);
- `linear`: default / factor;
- `dynamic`: NTK scaling only changes the frequencies beyond `max_position_embeddings`, the
  context limit recorded for the model, so inside it this is `default`;
- `llama3`: Llama 3.1's wavelength-dependent scaling;
- `yarn`: interpolation below, extrapolation above the [beta_slow, beta_fast] rotation ramp,
  attention factor 0.1 ln(factor) + 1 (or the mscale / mscale_all_dim ratio, or `attention_factor`);
- `longrope` (Phi-3.5, Phi-4-mini): per-frequency `short_factor` divisors, `long_factor` ones
  for positions >= `original_max_position_embeddings`, attention factor
  sqrt(1 + ln(factor) / ln(original)) with factor = max_position_embeddings / original.

transformers picks longrope's set by the highest position of each forward call; the table here
picks it per position, which is the same for every decode step and for any prefill that ends
before `original_max_position_embeddings` (a longer prefill uses the short set below it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.errors import InputError

from .llm_graph import RopeSpec, inv_freq_default, inv_freq_llama3


@dataclass
class RopeParams:
    """One rope parameter dict (`rope_parameters` or `rope_scaling` + `rope_theta`) and its context."""

    params: dict[str, Any]
    field: str  # where it came from, for error messages
    where: str  # the config file
    rotary_dim: int
    max_positions: int
    original_max: int | None = None  # a top-level original_max_position_embeddings (Phi-3)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def num(self, key: str, default: float | None = None) -> float:
        v = self.params.get(key, default)
        if v is None and default is not None:
            v = default
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise InputError(f"{self.where}: field '{self.field}.{key}' is missing or not a number")
        return float(v)

    def opt(self, key: str) -> float | None:
        v = self.params.get(key)
        return None if v is None else self.num(key)

    def original(self) -> int:
        """original_max_position_embeddings as transformers' standardize_rope_params resolves it."""
        if self.original_max is not None:
            return int(self.original_max)
        v = self.params.get("original_max_position_embeddings")
        return int(v) if v else int(self.max_positions)

    def theta(self) -> float:
        return self.num("rope_theta", 10000.0)


Result = tuple[np.ndarray, float, np.ndarray | None, int]


def _default(p: RopeParams) -> Result:
    """1 / theta^(2i/d)."""
    return inv_freq_default(p.theta(), p.rotary_dim), 1.0, None, 0


def _dynamic(p: RopeParams) -> Result:
    """default: dynamic NTK changes nothing inside `max_position_embeddings`, the context recorded."""
    return _default(p)


def _linear(p: RopeParams) -> Result:
    """default / `factor`."""
    inv = inv_freq_default(p.theta(), p.rotary_dim)
    return (inv / np.float32(p.num("factor"))).astype(np.float32), 1.0, None, 0


def _llama3(p: RopeParams) -> Result:
    """Llama 3.1: low frequencies / `factor`, high kept, a smooth ramp between."""
    inv = inv_freq_default(p.theta(), p.rotary_dim)
    return (
        inv_freq_llama3(
            inv, p.num("factor"), p.num("low_freq_factor"), p.num("high_freq_factor"), p.original()
        ),
        1.0,
        None,
        0,
    )


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _yarn(p: RopeParams) -> Result:
    """YaRN: interpolated below, extrapolated above the `beta_slow`..`beta_fast` ramp; cos/sin times the attention factor."""
    base, dim, original = p.theta(), p.rotary_dim, p.original()
    factor = p.opt("factor")
    if factor is None:
        factor = p.max_positions / original
    attn = p.opt("attention_factor")
    if attn is None:
        mscale, mscale_all = p.opt("mscale"), p.opt("mscale_all_dim")
        attn = (
            _mscale(factor, mscale) / _mscale(factor, mscale_all)
            if mscale and mscale_all
            else _mscale(factor)
        )
    beta_fast = p.opt("beta_fast") or 32.0
    beta_slow = p.opt("beta_slow") or 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    pos = (
        np.float32(base)
        ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))
    ).astype(np.float32)
    extrapolation = (np.float32(1.0) / pos).astype(np.float32)
    interpolation = (np.float32(1.0) / (np.float32(factor) * pos)).astype(np.float32)
    ramp = np.clip(
        (np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1
    )
    extra = (np.float32(1.0) - ramp.astype(np.float32)).astype(np.float32)
    inv = (interpolation * (np.float32(1.0) - extra) + extrapolation * extra).astype(np.float32)
    return inv, float(attn), None, 0


def _factors(p: RopeParams, key: str) -> np.ndarray:
    v = p.params.get(key)
    if (
        not isinstance(v, list)
        or len(v) != p.rotary_dim // 2
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    ):
        raise InputError(
            f"{p.where}: field '{p.field}.{key}' must list {p.rotary_dim // 2} numbers "
            "(one per rotary frequency)"
        )
    return np.asarray(v, np.float32)


def _longrope(p: RopeParams) -> Result:
    """LongRoPE: `short_factor` divisors, `long_factor` from `original_max_position_embeddings` on; attention factor."""
    base, dim, original = p.theta(), p.rotary_dim, p.original()
    factor = p.opt("factor")
    if factor is None:
        factor = p.max_positions / original
    attn = p.opt("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = (
        np.float32(base)
        ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))
    ).astype(np.float32)
    short = (np.float32(1.0) / (_factors(p, "short_factor") * shape)).astype(np.float32)
    long = (np.float32(1.0) / (_factors(p, "long_factor") * shape)).astype(np.float32)
    return short, float(attn), long, original


ROPE_TYPES: dict[str, Callable[[RopeParams], Result]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "llama3": _llama3,
    "yarn": _yarn,
    "longrope": _longrope,
}


def rope_spec_from(rtype: str, p: RopeParams) -> RopeSpec:
    """The RopeSpec of one rope parameter dict (rtype already checked against ROPE_TYPES)."""
    inv, attn, long, start = ROPE_TYPES[rtype](p)
    long_t = tuple(float(f) for f in long) if long is not None and start < p.max_positions else ()
    return RopeSpec(
        tuple(float(f) for f in inv),
        p.rotary_dim,
        False,
        float(np.float32(attn)),
        inv_freq_long=long_t,
        long_from=start if long_t else 0,
    )


__all__ = ["ROPE_TYPES", "RopeParams", "rope_spec_from"]
