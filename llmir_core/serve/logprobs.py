"""Token log-probabilities: `/v1/completions`' `logprobs` and `echo` (OpenAI's legacy object)
and chat's `logprobs` / `top_logprobs` (`chat_logprobs`).

`score(rows, ids, k)` turns logits rows into each next token's log-probability under the model
(a float64 log-softmax of the raw logits: before temperature and top-p, the model's own
distribution, as vLLM reports it) and its `k` most likely alternatives. `legacy_logprobs`
builds the answer's `logprobs` object: `tokens` (the text each token adds, special tokens
written out), `token_logprobs` (None for the first prompt token, which nothing predicts),
`top_logprobs` (one dict text -> log-probability per token; None for the first prompt token;
alternatives whose texts coincide keep the likeliest) and `text_offset` (where each token's text
starts in the choice's text; special tokens take no room there).

Detokenizing is incremental over a window of a few tokens, so a prompt of n tokens costs O(n)
decode calls of bounded length; the token before the window is kept as context (SentencePiece
decoders drop a leading space at the start of a text).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.runtime.scoring import log_softmax, top_logprobs

WINDOW = 8  # tokens decoded together at most, besides the one of context


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the k likeliest tokens, likeliest first


def score(rows: np.ndarray, ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """rows[i] are the logits that predict ids[i]: its log-probability and the top k (the same
    log-softmax and ordering as `llmir eval`, llmir_core/runtime/scoring.py)."""
    logp = log_softmax(np.atleast_2d(rows)[: len(ids)])
    return [
        TokenLogprob(int(tok), float(row[int(tok)]), tuple(top_logprobs(row, k)))
        for row, tok in zip(logp, ids)
    ]


def _stable(text: str) -> str:
    """Text without a trailing U+FFFD (a character still incomplete)."""
    return text[:-1] if text.endswith("\ufffd") else text


def _after(text: str, before: str) -> str:
    return text[len(before) :] if text.startswith(before) else text


def token_texts(
    decode: Callable[[list[int]], str],
    ids: Sequence[int],
    start: int,
    alternatives: Sequence[Sequence[int]] = (),
) -> tuple[list[str], list[list[str]]]:
    """The text each of ids[start:] adds after the ones before it, and the text each of its
    alternatives (alternatives[i] for ids[start + i]) would add in its place."""
    ids = list(ids)
    k = max(0, start - 1)
    done = _stable(decode(ids[k:start]))
    texts: list[str] = []
    alts: list[list[str]] = []
    for i in range(start, len(ids)):
        before = done
        raw = decode(ids[k : i + 1])
        text = raw if i == len(ids) - 1 else _stable(raw)
        texts.append(_after(text, before))
        j = i - start
        alts.append(
            [_after(decode([*ids[k:i], a]), before) for a in alternatives[j]]
            if j < len(alternatives)
            else []
        )
        done = text
        if i - k >= WINDOW and raw == text:  # the window restarts with this token as context
            k = i
            done = _stable(decode(ids[k : i + 1]))
    return texts, alts


def legacy_logprobs(
    decode: Callable[[list[int]], str],
    special: Collection[int],
    prompt_ids: Sequence[int],
    prompt: Sequence[TokenLogprob] | None,
    generated: Sequence[TokenLogprob],
    prompt_chars: int | None = None,
) -> dict[str, Any]:
    """OpenAI's legacy `logprobs` object for one choice.

    prompt: the log-probabilities of prompt_ids[1:] when the prompt is echoed (None: it is not);
    generated: those of the generated tokens (an end-of-sequence token included: it has a
    log-probability though it adds no text). prompt_chars: the length of the echoed prompt's
    text in the answer, where the generated tokens' offsets start (default: its decoded length).
    `decode` must write special tokens out (skip_special_tokens=False)."""
    ids = [*prompt_ids, *(g.token for g in generated)]
    entries: list[TokenLogprob | None] = [*generated]
    start = len(prompt_ids)
    if prompt is not None:
        if len(prompt) != max(len(prompt_ids) - 1, 0):
            raise ValueError(f"{len(prompt)} prompt log-probs for {len(prompt_ids)} prompt tokens")
        entries = [None, *prompt, *generated] if prompt_ids else [*generated]
        start = 0
    texts, alts = token_texts(
        decode, ids, start, [[a for a, _ in e.top] if e else [] for e in entries]
    )
    offsets, at = [], 0
    for n, (tok, text) in enumerate(zip(ids[start:], texts)):
        if prompt is not None and n == len(prompt_ids) and prompt_chars is not None:
            at = prompt_chars  # the first generated token starts after the prompt as given
        offsets.append(at)
        at += 0 if tok in special else len(text)
    tops: list[dict[str, float] | None] = []
    for e, keys in zip(entries, alts):
        if e is None:
            tops.append(None)
            continue
        top: dict[str, float] = {}
        for key, (_, lp) in zip(keys, e.top):
            top.setdefault(key, lp)  # e.top is likeliest first: a coinciding text keeps the max
        tops.append(top)
    return {
        "tokens": texts,
        "token_logprobs": [e.logprob if e else None for e in entries],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _entry(text: str, logprob: float) -> dict[str, Any]:
    return {
        "token": text,
        "logprob": logprob,
        "bytes": list(text.encode("utf-8", "surrogatepass")),
    }


def chat_logprobs(
    decode: Callable[[list[int]], str], context: Sequence[int], generated: Sequence[TokenLogprob]
) -> dict[str, Any]:
    """OpenAI's chat `logprobs` object for generated tokens that follow `context` (the prompt
    and the tokens generated before them): {"content": [{"token", "logprob", "bytes",
    "top_logprobs": [{"token", "logprob", "bytes"}, ...]}], "refusal": None}.

    The log-probabilities are of the model's own distribution (a log-softmax of the raw
    logits, before logit_bias, penalties, temperature and the top-k / top-p / min-p filters,
    as vLLM reports them by default); `top_logprobs` lists the k likeliest tokens under it,
    likeliest first. A token's text is what it adds to the text after the ones before it
    (`token_texts`: a token that ends a multi-byte character carries the whole character) and
    `bytes` its UTF-8 encoding; `decode` writes special tokens out."""
    ids = [*context, *(g.token for g in generated)]
    texts, alts = token_texts(decode, ids, len(context), [[a for a, _ in g.top] for g in generated])
    content = []
    for g, text, keys in zip(generated, texts, alts):
        entry = _entry(text, g.logprob)
        entry["top_logprobs"] = [_entry(key, lp) for key, (_, lp) in zip(keys, g.top)]
        content.append(entry)
    return {"content": content, "refusal": None}


__all__ = [
    "TokenLogprob",
    "log_softmax",
    "score",
    "token_texts",
    "legacy_logprobs",
    "chat_logprobs",
    "WINDOW",
]
