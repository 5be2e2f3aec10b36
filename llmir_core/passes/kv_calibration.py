"""Calibration of static KV-cache scales: run the f32 decoder on prompts with the reference
interpreter and keep, per cache entry, the largest |value| it writes (per head and channel).

Used by `kv-cache-int8{scales=calibrated}`. Deterministic: the same module and prompts give the
same scales (the interpreter is numpy, single-threaded in its reductions' order).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np

from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Value
from llmir_core.ir.types import TensorType, numpy_dtype

# The built-in calibration prompt: ordinary English prose with digits and punctuation, so the
# keys and values it produces look like those of everyday use.
DEFAULT_TEXT = (
    "The quick brown fox jumps over the lazy dog. In 1905, Albert Einstein published four "
    "papers that changed physics: on the photoelectric effect, Brownian motion, special "
    "relativity and the equivalence of mass and energy. Water boils at 100 degrees Celsius at "
    "sea level; at the top of Mount Everest it boils at about 70. Question: what is 12 times 7? "
    "Answer: 84. The meeting was moved to Tuesday, 3 p.m., because the room was booked."
)
SAMPLE = 32  # calibration ids recorded in the module for differential validation
MAX_TOKENS = 512  # per prompt: the interpreter's cost grows with the square of the length


@dataclass(frozen=True)
class Calibration:
    amax: dict[str, np.ndarray]  # present output name -> [kv_heads, head_dim] max |value|
    source: str  # what was run, for the provenance attribute
    prompts: int
    tokens: int
    sample: list[int]  # the first ids run (validation draws its inputs from them)


def _builtin_ids(vocab: int, n: int = 96) -> list[int]:
    """Deterministic spread-out ids for a module without a tokenizer."""
    return [int((7919 * i + 17) % vocab) for i in range(n)]


def _vocab(fn: Function) -> int:
    t = fn.outputs[0].type
    v = t.shape[-1] if isinstance(t, TensorType) else None
    return int(v) if isinstance(v, int) else 32000


def prompt_ids(module: Module, path: str) -> tuple[list[list[int]], str]:
    """The calibration prompts as token ids, and a description of where they came from."""
    vocab = _vocab(module.main)
    texts: list[str] | None = None
    src = ""
    if path:
        if not os.path.isfile(path):
            raise InputError(
                f"{path}: calibration file not found",
                hint="kv-cache-int8{calibration=FILE} takes a text file with one prompt per line",
            )
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read the calibration prompts: {exc}") from None
        texts = [line.strip() for line in text.splitlines() if line.strip()]
        if not texts:
            raise InputError(
                f"{path}: the calibration file holds no prompt",
                hint="write one prompt per line",
            )
        src = f"{os.path.basename(path)} (sha256 {hashlib.sha256(raw).hexdigest()[:16]})"
    tok = None
    if module.attrs.get("llm.tokenizer"):
        from llmir_core.runtime.tokenizer import load_tokenizer

        try:
            tok = load_tokenizer(module)
        except InputError:
            if texts is not None:
                raise
    if texts is None:
        if tok is None:
            return [_builtin_ids(vocab)], "built-in ids (the module names no tokenizer)"
        texts, src = [DEFAULT_TEXT], "the built-in calibration text"
    elif tok is None:
        raise InputError(
            f"module @{module.name} names no tokenizer, so the prompts of {path} cannot be encoded",
            hint="import the model with its tokenizer, or leave out calibration= to use "
            "built-in ids",
        )
    ctx = module.attrs.get("llm.context_length")
    limit = min(MAX_TOKENS, ctx) if isinstance(ctx, int) and ctx > 0 else MAX_TOKENS
    ids = [[i for i in tok.encode(t) if 0 <= i < vocab][:limit] for t in texts]
    ids = [x for x in ids if x]
    if not ids:
        raise InputError(f"{src}: the prompts encode to no token of the model's vocabulary")
    return ids, src


def calibrate(module: Module, presents: list[Value], path: str = "") -> Calibration:
    """Run the f32 decoder on each prompt (batch 1, empty cache) and return, for each of the
    `presents` (outputs of main), max |value| over batch and positions: [kv_heads, head_dim]."""
    from llmir_core.interp import Interpreter

    fn = module.main
    prompts, src = prompt_ids(module, path)
    idx = {id(v): i for i, v in enumerate(fn.outputs)}
    interp = Interpreter(module)
    amax: dict[str, np.ndarray] = {}
    for ids in prompts:
        n = len(ids)
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.asarray([ids], np.int64),
            "positions": np.arange(n, dtype=np.int64)[None, :],
        }
        for a in fn.args[2:]:
            t = a.type
            assert isinstance(t, TensorType)
            shape = (1, t.shape[1], 0, t.shape[3])
            feeds[a.name] = np.zeros(shape, numpy_dtype(t.dtype))  # type: ignore[arg-type]
        outs = interp.run(feeds)
        for v in presents:
            x = np.abs(np.asarray(outs[idx[id(v)]], np.float32)).max(axis=(0, 2))
            prev = amax.get(v.name)
            amax[v.name] = x if prev is None else np.maximum(prev, x)
    tokens = sum(len(p) for p in prompts)
    return Calibration(amax, src, len(prompts), tokens, prompts[0][:SAMPLE])


__all__ = ["Calibration", "calibrate", "prompt_ids", "DEFAULT_TEXT"]
