"""Log-probabilities of a token sequence under a model: the scoring core of `llmir eval` and of
`llmir serve`'s echo/logprobs.

A `Scorer` runs one sequence from an empty cache and returns the logits of every position it is
asked for: `scorer.logits(ids, start)` is float32 [len(ids) - start, vocab], row r the logits of
the token that follows `ids[: start + r + 1]`. Nothing is kept between calls. `token_logprobs`
turns those rows into log-softmax rows; `chosen_logprobs` and `top_logprobs` read them.

Scorers for llmir's own runtimes live here: a decoder artifact folder (onnxruntime), and a
`.llmir` decoder module run by the numpy reference interpreter (or built into a temporary
artifact). `open_model(path)` opens any source `llmir eval` accepts, with its tokenizer; the
scorers of other runtimes (llama.cpp for a GGUF file, transformers for a Hugging Face folder)
are in `scoring_peers`, the only module that imports those libraries.

An artifact built with the default `--logits last` returns only the last position's logits; a
`DecoderScorer` made with `stepwise=True` then runs the positions one at a time (one decode
step per scored position: correct, and much slower), otherwise it is an InputError telling the
user to rebuild with `--logits all`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from llmir_core.errors import InputError
from llmir_core.runtime.tokenizer import Tokenizer


@runtime_checkable
class Scorer(Protocol):
    """Logits of every position of one sequence (a fresh cache each call)."""

    name: str  # what runs it: "onnxruntime", "reference", "llama.cpp", "transformers"
    max_context: int | None  # the most positions one call may take (None: no known limit)

    def logits(self, ids: Sequence[int], start: int = 0) -> np.ndarray:
        """float32 [len(ids) - start, vocab]: row r predicts the token after ids[:start + r + 1]."""
        ...


@dataclass
class ScoringModel:
    """A scorer with what reading text needs: the tokenizer (None when the source has none) and
    where it came from. `keep` holds resources that must live as long as the scorer (a
    temporary build folder)."""

    path: str
    kind: str  # "llmir" (artifact or .llmir), "llama.cpp", "transformers"
    scorer: Scorer
    tokenizer: Tokenizer | None
    keep: list[Any] = field(default_factory=list)

    def adds_bos(self) -> int | None:
        """The BOS id the tokenizer puts before a text, or None when it adds none."""
        return adds_bos(self.tokenizer) if self.tokenizer is not None else None


def adds_bos(tok: Tokenizer) -> int | None:
    """The id the tokenizer's post-processor puts in front of a text (its BOS), or None.

    Found by encoding a probe text with and without special tokens, so it follows the
    tokenizer's own rule (a GGUF `add_bos_token`, an HF TemplateProcessing) rather than guessing
    from the presence of a BOS id."""
    probe = "The"
    plain = tok.encode(probe, add_special_tokens=False)
    full = tok.encode(probe, add_special_tokens=True)
    if len(full) > len(plain) and full[1 : 1 + len(plain)] == plain:  # "<s> $A" or "<s> $A </s>"
        return int(full[0])
    return None


class DecoderScorer:
    """A `Scorer` over a decoder (the `reset`/`forward` protocol of runtime.generate).

    last_only: the decoder returns the last position's logits only (an artifact built with
    `--logits last`); then every position must be a step of its own (`stepwise`)."""

    def __init__(
        self, decoder: Any, name: str, *, last_only: bool = False, stepwise: bool = False
    ) -> None:
        self.decoder = decoder
        self.name = name
        self.last_only = last_only
        self.stepwise = stepwise
        self.max_context: int | None = getattr(decoder, "max_context", None)

    def logits(self, ids: Sequence[int], start: int = 0) -> np.ndarray:
        seq = _check_ids(ids, start, self.max_context)
        if hasattr(self.decoder, "reserve"):
            self.decoder.reserve(len(seq))
        self.decoder.reset(1)
        if not self.last_only:
            out = np.asarray(self.decoder.forward(seq[None, :]), dtype=np.float32)
            return np.ascontiguousarray(out[0, start:])
        if not self.stepwise:
            raise InputError(
                "the artifact computes the last position's logits only (built with --logits last)",
                hint="rebuild it with `llmir build MODEL.llmir --logits all -o DIR`",
            )
        # the positions before `start` go in as one prefill; each later position is a step
        rows = [np.asarray(self.decoder.forward(seq[None, : start + 1]))[0, -1]]
        for tok in seq[start + 1 :]:
            rows.append(np.asarray(self.decoder.forward(np.array([[tok]], np.int64)))[0, -1])
        return np.stack(rows).astype(np.float32, copy=False)


def _check_ids(ids: Sequence[int], start: int, max_context: int | None) -> np.ndarray:
    seq = np.asarray(list(ids), dtype=np.int64)
    if seq.ndim != 1 or seq.size == 0:
        raise InputError("scoring needs at least one token id")
    if not 0 <= start < seq.size:
        raise InputError(f"start {start} is outside the {seq.size} positions")
    if max_context is not None and seq.size > max_context:
        raise InputError(
            f"{seq.size} tokens exceed the model's context of {max_context}",
            hint="use a shorter sequence (llmir eval: a smaller --ctx)",
        )
    return seq


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax over the last axis (max-subtracted, so large logits stay finite)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def as_scorer(model: ScoringModel | Scorer | Any) -> Scorer:
    """The scorer of a ScoringModel, a Scorer as is, a path (`open_model(path, stepwise=True)`),
    or a decoder (reset/forward: an `OrtDecoder` from `open_artifact`, a `FunctionDecoder`);
    a decoder of a last-position-logits artifact is scored one position at a time."""
    if isinstance(model, ScoringModel):
        return model.scorer
    if isinstance(model, (str, os.PathLike)):
        return open_model(os.fspath(model), stepwise=True).scorer
    if isinstance(model, Scorer):
        return model
    if hasattr(model, "forward") and hasattr(model, "reset"):
        manifest = getattr(model, "manifest", None) or {}
        last = (manifest.get("decoder") or {}).get("logits") == "last"
        name = "onnxruntime" if manifest else "reference"
        return DecoderScorer(model, name, last_only=last, stepwise=True)
    raise TypeError(f"cannot score with {type(model).__name__}")


def token_logprobs(
    model: ScoringModel | Scorer | Any, ids: Sequence[int], start: int = 0
) -> np.ndarray:
    """Log-softmax rows of every position from `start`: float64 [len(ids) - start, vocab], row r
    the log-probabilities of the token after ids[:start + r + 1]. The last row predicts past the
    sequence; `chosen_logprobs` drops it. `model`: anything `as_scorer` takes."""
    return log_softmax(as_scorer(model).logits(ids, start))


def chosen_logprobs(rows: np.ndarray, ids: Sequence[int], start: int = 0) -> np.ndarray:
    """The log-probability each token of ids[start + 1:] got from the row before it (rows as
    `token_logprobs(model, ids, start)` returns them): float64 [len(ids) - start - 1]."""
    targets = np.asarray(list(ids)[start + 1 :], dtype=np.int64)
    return np.asarray(rows[np.arange(targets.size), targets], dtype=np.float64)


def top_logprobs(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one log-softmax row, most likely first (ties: lower id first)."""
    if k <= 0:
        return []
    k = min(k, row.shape[-1])
    idx = np.argpartition(-row, k - 1)[:k]
    order = sorted(idx.tolist(), key=lambda i: (-float(row[i]), i))
    return [(int(i), float(row[i])) for i in order]


def open_model(
    path: str,
    *,
    threads: int | None = None,
    backend: str | None = None,
    stepwise: bool = False,
) -> ScoringModel:
    """The scoring model of a source: a decoder artifact folder (onnxruntime), a `.llmir`
    decoder module (backend "reference", the default, or "onnxruntime": built into a temporary
    folder with every position's logits), a `.gguf` file (llama.cpp) or a Hugging Face model
    folder (transformers)."""
    if not os.path.exists(path):
        raise InputError(
            f"{path}: no such file or folder",
            hint="pass an artifact folder, a .llmir file, a .gguf file or a Hugging Face folder",
        )
    if backend is not None and not path.lower().endswith(".llmir"):
        raise InputError(
            f"{path}: --backend applies to .llmir files only",
            hint="an artifact runs on the runtime it was built for",
        )
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "manifest.json")):
            return _artifact_model(path, threads, stepwise)
        if os.path.isfile(os.path.join(path, "config.json")):
            from llmir_core.runtime.scoring_peers import transformers_model

            return transformers_model(path, threads)
        raise InputError(
            f"{path}: neither an artifact folder (manifest.json) nor a Hugging Face model "
            "folder (config.json)"
        )
    lower = path.lower()
    if lower.endswith(".llmir"):
        return _llmir_model(path, backend or "reference", threads)
    if lower.endswith(".gguf"):
        from llmir_core.runtime.scoring_peers import llama_cpp_model

        return llama_cpp_model(path, threads)
    raise InputError(
        f"{path}: not a model llmir can score",
        hint="pass an artifact folder, a .llmir file, a .gguf file or a Hugging Face folder",
    )


def _artifact_model(path: str, threads: int | None, stepwise: bool) -> ScoringModel:
    from llmir_core.runtime.textgen import load_artifact_tokenizer, open_decoder

    dec = open_decoder(path, threads=threads)
    manifest = dec.manifest
    last_only = manifest["decoder"].get("logits") == "last"
    if last_only and not stepwise:
        raise InputError(
            f"{path}: the artifact computes the last position's logits only, and scoring needs "
            "every position's",
            hint="rebuild it with `llmir build MODEL.llmir --logits all -o DIR`",
        )
    tok = load_artifact_tokenizer(path, manifest) if manifest["decoder"].get("tokenizer") else None
    scorer = DecoderScorer(dec, "onnxruntime", last_only=last_only, stepwise=stepwise)
    return ScoringModel(path, "llmir", scorer, tok)


def _llmir_model(path: str, backend: str, threads: int | None) -> ScoringModel:
    from llmir_core.interp import Interpreter
    from llmir_core.ir.parser import parse_file
    from llmir_core.runtime.decoder import FunctionDecoder, cache_specs
    from llmir_core.runtime.tokenizer import load_tokenizer
    from llmir_core.verifier import require_verified

    if backend not in ("reference", "onnxruntime"):
        raise InputError(f"unknown backend '{backend}' (known: reference, onnxruntime)")
    module = parse_file(path)
    require_verified(module, path)
    specs = cache_specs(module.main)  # an InputError for a module that is not a decoder
    tok = load_tokenizer(module) if isinstance(module.attrs.get("llm.tokenizer"), dict) else None
    if backend == "onnxruntime":
        from llmir_core.runtime.textgen import open_decoder
        from llmir_core.targets import build, build_options

        tmp = tempfile.TemporaryDirectory(prefix="llmir-eval-")
        art = os.path.join(tmp.name, "artifact")
        build(
            module,
            art,
            "onnxruntime",
            source_path=path,
            options=build_options(module, "onnxruntime", logits="all"),
        )
        scorer = DecoderScorer(open_decoder(art, threads=threads), "onnxruntime")
        return ScoringModel(path, "llmir", scorer, tok, keep=[tmp])
    ctx = module.attrs.get("llm.context_length")
    interp = Interpreter(module)
    dec = FunctionDecoder(
        lambda feeds: interp.run(feeds), specs, int(ctx) if isinstance(ctx, int) else None
    )
    return ScoringModel(path, "llmir", DecoderScorer(dec, "reference"), tok)


__all__ = [
    "Scorer",
    "ScoringModel",
    "DecoderScorer",
    "adds_bos",
    "as_scorer",
    "log_softmax",
    "token_logprobs",
    "chosen_logprobs",
    "top_logprobs",
    "open_model",
]
