"""The generation loop: prefill, then one token at a time, streaming; where it stops is the
shared stop policy (llmir_core.runtime.stop)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from llmir_core import tracing

from .grammar import Constraint, prefetch
from .sampling import Sampler
from .stop import StopPolicy
from .trace_attrs import kv_cache_bytes


class Decoder(Protocol):
    max_context: int | None
    length: int

    def reset(self, batch: int = 1) -> None: ...

    def forward(self, ids: np.ndarray) -> np.ndarray: ...


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "length"  # length | eos | stop_string | context
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    token_s: list[float] = field(default_factory=list)  # time of each decode step

    @property
    def decode_tokens_per_s(self) -> float:
        total = sum(self.token_s)
        return len(self.token_s) / total if total > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "text": self.text,
            "prompt_tokens": len(self.prompt_ids),
            "token_ids": self.ids,
            "stop_reason": self.stop_reason,
            "timings": {
                "prefill_s": self.prefill_s,
                "ttft_s": self.ttft_s,
                "decode_tokens_per_s": self.decode_tokens_per_s,
                "generated_tokens": len(self.ids),
            },
        }


def generate(
    decoder: Decoder,
    codec: TextCodec,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    sampler: Sampler,
    eos_ids: Sequence[int] = (),
    stop: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
    constraint: Constraint | None = None,
) -> GenerationResult:
    """Generate up to max_new_tokens after the prompt, streaming text pieces to on_text; with a
    constraint, only tokens its grammar allows (it ends the text once nothing else can follow).

    Traced as a span `generate` (GenAI attributes) with children `prefill` and `decode`."""
    c = sampler.config
    with tracing.span(
        "generate",
        {
            "gen_ai.operation.name": "text_completion",
            "gen_ai.request.max_tokens": max_new_tokens,
            "gen_ai.request.temperature": c.temperature,
            "gen_ai.request.top_p": c.top_p,
            "gen_ai.request.top_k": c.top_k,
            "gen_ai.request.seed": c.seed,
            "gen_ai.usage.input_tokens": len(prompt_ids),
        },
    ) as sp:
        res = _generate(
            decoder, codec, prompt_ids, max_new_tokens, sampler, eos_ids, stop, on_text, constraint
        )
        sp.set(
            {
                "gen_ai.usage.output_tokens": len(res.ids),
                "gen_ai.response.finish_reasons": [res.stop_reason],
                "gen_ai.server.time_to_first_token": res.ttft_s,
                "llmir.prefill_s": res.prefill_s,
                "llmir.decode.tokens_per_s": res.decode_tokens_per_s,
                "llmir.kv_cache.bytes": kv_cache_bytes(decoder),
            }
        )
    return res


def _generate(
    decoder: Decoder,
    codec: TextCodec,
    prompt_ids: list[int],
    max_new_tokens: int,
    sampler: Sampler,
    eos_ids: Sequence[int],
    stop: Sequence[str],
    on_text: Callable[[str], None] | None,
    constraint: Constraint | None = None,
) -> GenerationResult:
    res = GenerationResult(list(prompt_ids))
    decoder.reset(1)
    t0 = time.perf_counter()
    with tracing.span("prefill", {"gen_ai.usage.input_tokens": len(prompt_ids)}) as sp:
        logits = decoder.forward(np.asarray([prompt_ids], dtype=np.int64))
        sp.set({"llmir.kv_cache.bytes": kv_cache_bytes(decoder)})
    res.prefill_s = time.perf_counter() - t0
    with tracing.span("decode") as decode:
        history = list(prompt_ids)
        policy = StopPolicy(
            codec.decode,
            stop=stop,
            eos_ids=eos_ids,
            max_tokens=max_new_tokens,
            prompt_tokens=len(prompt_ids),
            max_context=decoder.max_context,
        )
        for step in range(max_new_tokens):
            tok_start = time.perf_counter()
            row = logits[0, -1]
            tok = sampler.pick(row if constraint is None else constraint.apply(row), history)
            if constraint is not None and tok not in eos_ids:
                constraint.accept(tok)
            if step == 0:
                res.ttft_s = time.perf_counter() - t0
            piece, why = policy.push(tok)
            if why != "eos":
                res.ids.append(tok)
                history.append(tok)
            if on_text and piece:
                on_text(piece)
            if why is None and constraint is not None and constraint.done:
                why = "eos"  # the grammar allows only the end now
            if why is not None:
                res.stop_reason = why
                break
            prefetch([constraint])  # the next mask, beside the forward
            logits = decoder.forward(np.asarray([[tok]], dtype=np.int64))
            res.token_s.append(time.perf_counter() - tok_start)
        decode.set(
            {
                "gen_ai.usage.output_tokens": len(res.ids),
                "gen_ai.server.time_to_first_token": res.ttft_s,
                "llmir.decode.steps": len(res.token_s),
                "llmir.decode.tokens_per_s": res.decode_tokens_per_s,
                "llmir.kv_cache.bytes": kv_cache_bytes(decoder),
            }
        )
    piece = policy.finish()
    if on_text and piece:
        on_text(piece)
    res.text = policy.text if res.stop_reason == "stop_string" else codec.decode(res.ids)
    return res
