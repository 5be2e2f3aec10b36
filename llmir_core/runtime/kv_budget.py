"""How many tokens a server's KV slots may hold by default: what fits in this machine's memory.

A batch decoder of a `kv_cache: shared_buffer` artifact (onnxruntime's OrtBatchDecoder)
allocates `slots x max_context x token_bytes` of KV buffers at start (every slot can reach the
full context). `llmir serve` without `--max-context` takes the model's context (the manifest's
`max_len`), capped so that this stays within `KV_MEMORY_FRACTION` of the memory left for it:
MemAvailable (/proc/meminfo) minus the artifact's files (its weights, about what loading it
takes). The cap is rounded down to a multiple of `CONTEXT_STEP` tokens, and is never below
`min(model context, CONTEXT_STEP)`. Where MemAvailable cannot be read (not Linux) the model's
context is kept; decoders whose buffers grow as sequences need rows keep it too. The start-up
line says which, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KV_MEMORY_FRACTION = 0.5  # of MemAvailable minus the weights, for the KV buffers of every slot
CONTEXT_STEP = 256  # the default context is a multiple of this many tokens
MEMINFO = "/proc/meminfo"


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (the kernel's estimate of the memory a new
    program can take without swapping), or None where it cannot be read."""
    try:
        with open(MEMINFO, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def size_text(n: float) -> str:
    """Bytes in binary units, three significant digits: 36 KiB, 9.00 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class ContextChoice:
    """The context each slot is opened with, and the sentence `llmir serve` says about it."""

    max_context: int | None  # None: the model's (nothing to cap, or nothing known)
    line: str


def default_context(
    model_context: int | None,
    slots: int,
    token_bytes: int,
    weights_bytes: int,
    available: int | None,
) -> ContextChoice:
    """The model's context, capped so slots x context x token_bytes stays within
    KV_MEMORY_FRACTION of (available - weights_bytes) (see the module docstring)."""
    if not model_context or token_bytes <= 0 or slots < 1:
        return ContextChoice(None, "max context: the model's (no KV size known to check)")
    need = slots * model_context * token_bytes
    sum_text = f"{slots} slots x {model_context} x {size_text(token_bytes)} = {size_text(need)}"
    if available is None:
        return ContextChoice(
            None, f"max context {model_context} (the model's; {sum_text}; MemAvailable unknown)"
        )
    budget = max(0, int((available - weights_bytes) * KV_MEMORY_FRACTION))
    where = (
        f"{size_text(budget)} ({KV_MEMORY_FRACTION:.0%} of {size_text(available)} available "
        f"less {size_text(weights_bytes)} of artifact files)"
    )
    if need <= budget:
        return ContextChoice(
            model_context, f"max context {model_context} (the model's): {sum_text} fits in {where}"
        )
    fits = budget // (slots * token_bytes) // CONTEXT_STEP * CONTEXT_STEP
    chosen = max(fits, min(model_context, CONTEXT_STEP))
    verdict = "does" if chosen == fits else f"is the least it opens with ({CONTEXT_STEP} tokens)"
    return ContextChoice(
        chosen,
        f"max context {chosen} (model: {model_context}): {sum_text} would not fit in {where}, "
        f"{slots} x {chosen} x {size_text(token_bytes)} = "
        f"{size_text(slots * chosen * token_bytes)} {verdict}; --max-context N sets it",
    )


def choose_context(manifest: dict[str, Any], slots: int, given: int | None) -> ContextChoice:
    """The context a server opens `slots` slots of the manifest's decoder with: `given`
    (--max-context) as is, else (shared KV buffers) `default_context` from the decoder's max_len, its KV bytes per
    token (its cache entries) and this machine's MemAvailable (`mem_available`, read now)."""
    from .kv_slots import cache_token_bytes

    dec = manifest.get("decoder") or {}
    model_context = dec.get("max_len")
    caches = dec.get("cache") or []
    token_bytes = cache_token_bytes(caches) if caches else int(dec.get("kv_bytes_per_token") or 0)
    if given is not None:
        return ContextChoice(given, _given_line(given, model_context, slots, token_bytes))
    if dec.get("kv_cache") != "shared_buffer":  # buffers that grow as sequences need rows
        return ContextChoice(None, f"max context {model_context} (the model's)")
    return default_context(
        model_context, slots, token_bytes, artifact_bytes(manifest), mem_available()
    )


def _given_line(given: int, model_context: int | None, slots: int, token_bytes: int) -> str:
    """What `--max-context N` gives: N, or the model's context where that is smaller."""
    used = min(given, model_context) if model_context else given
    model = f"model: {model_context}" if model_context else "the model gives none"
    line = f"max context {used} (--max-context {given}; {model})"
    if token_bytes and used > 0:
        kv = size_text(slots * used * token_bytes)
        line += f": {slots} slots x {used} x {size_text(token_bytes)} = {kv}"
    return line


def artifact_bytes(manifest: dict[str, Any]) -> int:
    """The bytes of the files a manifest lists (its weights and graph, tokenizer included)."""
    files = manifest.get("files") or {}
    return sum(int(f.get("bytes") or 0) for f in files.values() if isinstance(f, dict))


__all__ = [
    "CONTEXT_STEP",
    "KV_MEMORY_FRACTION",
    "ContextChoice",
    "artifact_bytes",
    "choose_context",
    "default_context",
    "mem_available",
    "size_text",
]
