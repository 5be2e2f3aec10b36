"""Scorers of other runtimes, for `llmir eval --against`: a GGUF file run by llama.cpp (through
llama-cpp-python) and a Hugging Face folder run by transformers (torch, float32).

Each implements `scoring.Scorer` (every position's logits of one sequence from an empty cache)
and is opened with the source's tokenizer as llmir reads it, so `llmir eval` can check that both
models share a vocabulary. The libraries are imported here only, on first use; a missing one is
an InputError naming the package to install.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from llmir_core.errors import InputError
from llmir_core.interrupts import import_optional

from .scoring import ScoringModel, _check_ids
from .tokenizer import Tokenizer


def _tokenizer_or_none(path: str) -> Tokenizer | None:
    """The source's tokenizer as llmir reads it, or None when llmir cannot read it (then only
    the logits' widths are compared)."""
    from .tokenize_src import open_tokenizer

    try:
        return open_tokenizer(path)
    except InputError:
        return None


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the block (C code writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class LlamaCppScorer:
    """A GGUF model run by llama.cpp with every position's logits kept (`logits_all`). The
    context is sized by the longest sequence asked for so far (the model is loaded again when a
    longer one comes)."""

    name = "llama.cpp"

    def __init__(self, path: str, threads: int | None) -> None:
        self.lib = import_optional(
            "llama_cpp",
            "scoring a GGUF file needs llama.cpp's Python bindings (package llama-cpp-python), "
            "which are not installed",
            hint="pip install llama-cpp-python, or build the GGUF with llmir and pass the artifact",
        )
        self.path = path
        self.threads = threads or os.cpu_count() or 1
        self.llm: Any = None
        self.n_ctx = 0
        self.max_context: int | None = None

    def _load(self, n: int) -> Any:
        if self.llm is None or n > self.n_ctx:
            self.llm = None  # free the old context first
            try:
                with _quiet_stderr():  # llama.cpp logs from C as it makes the context
                    self.llm = self.lib.Llama(
                        model_path=self.path,
                        n_ctx=n,
                        n_batch=n,
                        n_ubatch=n,
                        logits_all=True,
                        n_threads=self.threads,
                        n_threads_batch=self.threads,
                        verbose=False,
                    )
            except (ValueError, RuntimeError) as exc:
                raise InputError(f"{self.path}: llama.cpp cannot load the model: {exc}") from None
            self.n_ctx = n
        return self.llm

    def logits(self, ids: Sequence[int], start: int = 0) -> np.ndarray:
        seq = _check_ids(ids, start, self.max_context)
        llm = self._load(int(seq.size))
        llm.reset()
        llm.eval([int(t) for t in seq])
        return np.array(llm.scores[start : seq.size], dtype=np.float32)


class TransformersScorer:
    """A Hugging Face folder run by transformers on torch in float32 (no cache kept)."""

    name = "transformers"

    def __init__(self, path: str, threads: int | None) -> None:
        import_optional("torch", "torch is not installed", hint="pip install torch transformers")
        transformers = import_optional(
            "transformers",
            "scoring a Hugging Face folder needs transformers, which is not installed",
            hint="pip install torch transformers",
        )
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32
            ).eval()
        except (OSError, ValueError, KeyError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{path}: transformers cannot load the model: {first}") from None
        ctx = getattr(self.model.config, "max_position_embeddings", None)
        self.max_context: int | None = int(ctx) if isinstance(ctx, int) else None

    def logits(self, ids: Sequence[int], start: int = 0) -> np.ndarray:
        seq = _check_ids(ids, start, self.max_context)
        torch = self.torch
        with torch.inference_mode():
            out = self.model(input_ids=torch.from_numpy(seq)[None, :], use_cache=False)
        return np.ascontiguousarray(out.logits[0, start:].float().numpy(), dtype=np.float32)


def llama_cpp_model(path: str, threads: int | None) -> ScoringModel:
    return ScoringModel(path, "llama.cpp", LlamaCppScorer(path, threads), _tokenizer_or_none(path))


def transformers_model(path: str, threads: int | None) -> ScoringModel:
    scorer = TransformersScorer(path, threads)
    return ScoringModel(path, "transformers", scorer, _tokenizer_or_none(path))


__all__ = ["LlamaCppScorer", "TransformersScorer", "llama_cpp_model", "transformers_model"]
