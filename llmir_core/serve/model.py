"""A decoder artifact ready to serve: its tokenizer, chat template and a running `Scheduler`.

Prompts are encoded exactly as `llmir run` encodes them (`llmir_core.runtime.textgen`): plain
text with the tokenizer's special tokens (BOS), chat messages rendered with the model's chat
template and encoded without them; generated ids are decoded without special tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from llmir_core.errors import InputError
from llmir_core.runtime.batch_decoder import BatchDecoder, OrtBatchDecoder
from llmir_core.runtime.textgen import load_artifact_tokenizer, render_chat
from llmir_core.runtime.tokenizer import Tokenizer

from .metrics import Metrics
from .scheduler import Scheduler


class ServedModel:
    def __init__(
        self,
        name: str,
        manifest: dict[str, Any],
        tokenizer: Tokenizer,
        decoder: BatchDecoder,
        *,
        max_queue: int = 64,
        chunk: int = 32,
        metrics: Metrics | None = None,
        art_dir: str | None = None,
    ) -> None:
        self.name = name
        self.manifest = manifest
        self.art_dir = art_dir
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.metrics = metrics or Metrics()
        self.scheduler = Scheduler(
            decoder, self.decode, max_queue=max_queue, chunk=chunk, metrics=self.metrics
        )

    @property
    def max_context(self) -> int:
        return self.decoder.max_context

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.eos_ids)

    def _token(self, tid: int | None) -> str | None:
        if tid is None:
            return None
        tok = self.tokenizer.backend.id_to_token(int(tid))
        return str(tok) if tok is not None else None

    def encode_text(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        tpl = self.tokenizer.chat_template
        if not tpl:
            raise InputError("the model has no chat template: use /v1/completions")
        eos = self.tokenizer.eos_ids[0] if self.tokenizer.eos_ids else None
        text = render_chat(
            tpl, messages, bos_token=self._token(self.tokenizer.bos_id), eos_token=self._token(eos)
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def open_served_model(
    art_dir: str,
    *,
    max_batch: int = 8,
    max_queue: int = 64,
    chunk: int = 32,
    threads: int | None = None,
    max_context: int | None = None,
    name: str | None = None,
) -> ServedModel:
    """Open a decoder artifact for serving (onnxruntime, `max_batch` KV slots)."""
    if max_queue < 0:
        raise InputError(f"--max-queue must be >= 0, got {max_queue}")
    if chunk < 1:
        raise InputError(f"--prefill-chunk must be >= 1, got {chunk}")
    decoder = OrtBatchDecoder(art_dir, max_batch, threads=threads, max_context=max_context)
    tokenizer = load_artifact_tokenizer(art_dir, decoder.manifest)
    model_name = name or os.path.basename(os.path.normpath(os.path.abspath(art_dir)))
    return ServedModel(
        model_name,
        decoder.manifest,
        tokenizer,
        decoder,
        max_queue=max_queue,
        chunk=chunk,
        art_dir=art_dir,
    )


__all__ = ["ServedModel", "open_served_model"]
