"""Perplexity of a text under a model, and how far a model's token distributions are from a
reference's: the core of `llmir eval` (docs/eval.md).

The window scheme (the sliding-window perplexity of fixed-length models, as Hugging Face
describes it and llama.cpp's perplexity tool runs it): the text is tokenized once, without
special tokens, into T[0..N). A window reads `ctx` input positions: the model's BOS (when its
tokenizer adds one) followed by the text tokens T[b : b + L), L = ctx - 1 with a BOS, ctx
without. Window k starts at b = k * stride and ends at e = min(b + L, N); the last window is the
first that reaches N. Each window scores the tokens T[i], e_prev <= i < e, that no earlier
window scored (e_prev = the previous window's end); the first window scores every token it can
predict: all of T[0, e) after a BOS, T[1, e) without one. With 1 <= stride <= ctx - 1, every
token is scored exactly once (N in all with a BOS, N - 1 without); in every window after the
first, the first scored token has ctx - stride positions (the BOS included) before it.

Per scored token: log p(T[i]) under the target, and with a reference: the reference's log-prob,
KL(P_ref || P_target) over the whole vocabulary, and whether both models' most likely tokens are
the same. Perplexity = exp(-mean log p).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmir_core.errors import InputError

from .scoring import ScoringModel

DEFAULT_CTX = 512
ROW_CHUNK = 32  # rows scored at once (a 256k vocabulary: 3 float64 buffers of 32 rows, 200 MB)


@dataclass(frozen=True)
class Window:
    """One forward pass: the text tokens T[begin:end] (after a BOS when `bos`), scoring
    T[score_from:end]."""

    begin: int
    end: int
    score_from: int

    def inputs(self, tokens: Sequence[int], bos_id: int | None) -> list[int]:
        body = list(tokens[self.begin : self.end])
        return [bos_id, *body] if bos_id is not None else body

    def first_row(self, bos: bool) -> int:
        """The input position whose logits predict T[score_from]."""
        return self.score_from - self.begin + (1 if bos else 0) - 1


def resolve_ctx(ctx: int | None, max_context: int | None) -> int:
    """--ctx checked, defaulting to DEFAULT_CTX, and capped at the model's context."""
    if ctx is not None and ctx <= 1:
        raise InputError(
            f"--ctx must be at least 2 tokens, got {ctx}",
            hint="a window needs a token to predict from and one to predict",
        )
    want = DEFAULT_CTX if ctx is None else ctx
    if max_context is not None and want > max_context:
        if ctx is not None:
            raise InputError(
                f"--ctx {ctx} exceeds the model's context of {max_context} tokens",
                hint=f"use --ctx {max_context} or less",
            )
        want = max_context
    return want


def plan_windows(
    n_tokens: int, ctx: int, stride: int | None, bos: bool
) -> tuple[list[Window], int]:
    """The windows over n_tokens text tokens, and the stride used (default: ctx // 2).

    ctx counts the BOS when `bos`. stride must be in [1, ctx - 1], so that every window after
    the first holds at least one token before the first one it scores (with a BOS, a window of
    ctx - 1 text tokens advancing by ctx - 1 scores its first token from the BOS alone)."""
    if ctx <= 1:
        raise InputError(
            f"--ctx must be at least 2 tokens, got {ctx}",
            hint="a window needs a token to predict from and one to predict",
        )
    span = ctx - 1 if bos else ctx  # text tokens per window
    step = max(1, ctx // 2) if stride is None else stride
    if not 1 <= step <= ctx - 1:
        raise InputError(
            f"--stride must be between 1 and {ctx - 1} (--ctx minus 1), got {step}",
            hint="windows advance by the stride; a larger one would leave tokens unscored",
        )
    if n_tokens < 2:
        raise InputError(
            f"the text has {n_tokens} token(s); perplexity needs at least 2",
            hint="pass a longer --text file",
        )
    windows: list[Window] = []
    scored_to = 0 if bos else 1  # the first text token a window can predict
    begin = 0
    while True:
        end = min(begin + span, n_tokens)
        windows.append(Window(begin, end, scored_to))
        scored_to = end
        if end == n_tokens:
            return windows, step
        begin += step


@dataclass
class TokenScores:
    """Per scored token, in text order: the target's log-prob of the text token; with a
    reference, the reference's, KL(P_ref || P_target) and top-1 agreement."""

    target: list[np.ndarray] = field(default_factory=list)
    reference: list[np.ndarray] = field(default_factory=list)
    kl: list[np.ndarray] = field(default_factory=list)
    agree: list[np.ndarray] = field(default_factory=list)
    buffers: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def add(self, tgt_rows: np.ndarray, ref_rows: np.ndarray | None, targets: np.ndarray) -> None:
        """Score logits rows (row j predicts targets[j]), ROW_CHUNK rows at a time, in float64."""
        for a in range(0, targets.size, ROW_CHUNK):
            t = targets[a : a + ROW_CHUNK]
            rows = np.arange(t.size)
            xt = tgt_rows[a : a + ROW_CHUNK]
            lt = self._scratch(0, xt.shape)
            _log_softmax_into(xt, lt, self._scratch(1, xt.shape))
            self.target.append(lt[rows, t].copy())
            if ref_rows is None:
                continue
            xr = ref_rows[a : a + ROW_CHUNK]
            lr, pr = self._scratch(2, xr.shape), self._scratch(1, xr.shape)
            _log_softmax_into(xr, lr, pr)
            np.exp(lr, out=pr)
            self.reference.append(lr[rows, t].copy())
            self.agree.append(lr.argmax(axis=-1) == lt.argmax(axis=-1))
            # KL(P_r || P_t) = sum_v P_r(v) (log P_r(v) - log P_t(v)), per row
            self.kl.append(np.maximum(np.einsum("ij,ij->i", pr, np.subtract(lr, lt, out=lt)), 0.0))

    def _scratch(self, k: int, shape: tuple[int, ...]) -> np.ndarray:
        """A reused float64 work buffer: a fresh 64 MB array per chunk costs more in page faults
        than the arithmetic on it."""
        buf = self.buffers.get(k)
        if buf is None or buf.shape[1:] != shape[1:] or buf.shape[0] < shape[0]:
            buf = self.buffers[k] = np.empty((max(shape[0], ROW_CHUNK), *shape[1:]), np.float64)
        return buf[: shape[0]]


def _log_softmax_into(x: np.ndarray, out: np.ndarray, work: np.ndarray) -> None:
    """out = log_softmax(x) per row, in float64 (work: a buffer of out's shape)."""
    out[...] = x
    out -= out.max(axis=-1, keepdims=True)
    np.exp(out, out=work)
    out -= np.log(work.sum(axis=-1, keepdims=True))


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


def _perplexity(logp: np.ndarray) -> dict[str, float]:
    """Perplexity, the mean negative log-likelihood (nats) and its standard error."""
    nll = -logp
    se = float(nll.std(ddof=1) / math.sqrt(nll.size)) if nll.size > 1 else 0.0
    return {
        "perplexity": float(math.exp(nll.mean())),
        "nll_mean": float(nll.mean()),
        "nll_stderr": se,
    }


@dataclass
class EvalReport:
    """What `llmir eval` prints: the settings, the target's perplexity, and with a reference
    its perplexity and the comparison."""

    target: str
    target_runtime: str
    reference: str | None
    reference_runtime: str | None
    text_tokens: int
    scored_tokens: int
    windows: int
    ctx: int
    stride: int
    bos_id: int | None
    target_metrics: dict[str, float]
    reference_metrics: dict[str, float] | None
    comparison: dict[str, float] | None
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "target": {"path": self.target, "runtime": self.target_runtime, **self.target_metrics},
            "reference": (
                None
                if self.reference is None
                else {
                    "path": self.reference,
                    "runtime": self.reference_runtime,
                    **(self.reference_metrics or {}),
                }
            ),
            "comparison": self.comparison,
            "text_tokens": self.text_tokens,
            "scored_tokens": self.scored_tokens,
            "windows": self.windows,
            "ctx": self.ctx,
            "stride": self.stride,
            "bos_id": self.bos_id,
            "seconds": self.seconds,
        }


def compare(scores: TokenScores) -> tuple[dict[str, float], dict[str, float]]:
    """The reference's perplexity and the comparison metrics of scored tokens."""
    lt, lr, kl = _cat(scores.target), _cat(scores.reference), _cat(scores.kl)
    ref = _perplexity(lr)
    tgt_ppl = math.exp(float(-lt.mean()))
    return ref, {
        "perplexity_diff": tgt_ppl - ref["perplexity"],
        "perplexity_ratio": math.exp(float((lr - lt).mean())),
        "kl_mean": float(kl.mean()),
        "kl_stderr": float(kl.std(ddof=1) / math.sqrt(kl.size)) if kl.size > 1 else 0.0,
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "top1_agreement": float(_cat(scores.agree).mean()),
        "logprob_diff_mean": float((lt - lr).mean()),
    }


def check_vocabularies(target: ScoringModel, ref: ScoringModel) -> None:
    """Both models must read the same token ids: equal vocabularies (token -> id) when both
    tokenizers are known (the logits' widths are compared on the first window anyway)."""
    a, b = target.tokenizer, ref.tokenizer
    if a is None or b is None:
        return
    va = a.backend.get_vocab(with_added_tokens=True)
    vb = b.backend.get_vocab(with_added_tokens=True)
    if va == vb:
        return
    if len(va) != len(vb):
        why = f"{len(va)} tokens vs {len(vb)}"
    else:
        tok = next(t for t in sorted(va, key=va.__getitem__) if vb.get(t) != va[t])
        why = f"token {tok!r} is id {va[tok]} in the target, {vb.get(tok)} in the reference"
    raise InputError(
        f"{target.path} and {ref.path} have different vocabularies ({why})",
        hint="compare builds of one model, whose tokenizers are the same",
    )


def evaluate(
    target: ScoringModel,
    tokens: Sequence[int],
    *,
    ctx: int | None = None,
    stride: int | None = None,
    reference: ScoringModel | None = None,
    on_window: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Score `tokens` (a text's ids, no special tokens) with the window scheme above; compare
    with `reference` when given. on_window(done, total) follows the progress."""
    t0 = time.perf_counter()
    limits = [m.scorer.max_context for m in (target, reference) if m is not None]
    known = [c for c in limits if c is not None]
    width = resolve_ctx(ctx, min(known) if known else None)
    bos_id = target.adds_bos()
    windows, step = plan_windows(len(tokens), width, stride, bos_id is not None)
    if reference is not None:
        check_vocabularies(target, reference)
    scores = TokenScores()
    ids = np.asarray(list(tokens), dtype=np.int64)
    for k, w in enumerate(windows):
        inputs = w.inputs(tokens, bos_id)
        first = w.first_row(bos_id is not None)
        targets = ids[w.score_from : w.end]
        # the window's last position predicts past it: its row is not used
        tgt = target.scorer.logits(inputs, first)[:-1]
        ref = None
        if reference is not None:
            ref = reference.scorer.logits(inputs, first)[:-1]
            if ref.shape[-1] != tgt.shape[-1]:
                raise InputError(
                    f"{target.path} has {tgt.shape[-1]} logits per position, {reference.path} "
                    f"{ref.shape[-1]}: the vocabularies differ",
                    hint="compare builds of one model, whose tokenizers are the same",
                )
        scores.add(tgt, ref, targets)
        if on_window is not None:
            on_window(k + 1, len(windows))
    lt = _cat(scores.target)
    ref_metrics, comparison = compare(scores) if reference is not None else (None, None)
    return EvalReport(
        target=target.path,
        target_runtime=target.scorer.name,
        reference=reference.path if reference is not None else None,
        reference_runtime=reference.scorer.name if reference is not None else None,
        text_tokens=len(tokens),
        scored_tokens=int(lt.size),
        windows=len(windows),
        ctx=width,
        stride=step,
        bos_id=bos_id,
        target_metrics=_perplexity(lt),
        reference_metrics=ref_metrics,
        comparison=comparison,
        seconds=time.perf_counter() - t0,
    )


__all__ = [
    "DEFAULT_CTX",
    "Window",
    "plan_windows",
    "resolve_ctx",
    "TokenScores",
    "EvalReport",
    "check_vocabularies",
    "compare",
    "evaluate",
]
