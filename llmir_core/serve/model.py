"""A decoder artifact ready to serve: its tokenizer, chat template and a running `Scheduler`.

Prompts are encoded exactly as `llmir run` encodes them (`llmir_core.runtime.textgen`): plain
text with the tokenizer's special tokens (BOS), chat messages rendered with the model's chat
template and encoded without them; generated ids are decoded without special tokens.

`max_prompt_bytes` bounds a prompt before it is tokenized: `max_context` times the UTF-8 length
of the tokenizer's longest token (a text longer than that cannot fit the context).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

from llmir_core.artifact_check import full_checks
from llmir_core.errors import InputError
from llmir_core.runtime.batch_decoder import BatchDecoder
from llmir_core.runtime.chat_template import render_chat, template_timeout
from llmir_core.runtime.kv_budget import size_text
from llmir_core.runtime.textgen import load_artifact_tokenizer
from llmir_core.runtime.textstream import token_bytes_fn
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
        template_timeout_s: float | None = None,
        context_note: str = "",
    ) -> None:
        self.name = name
        self.context_note = context_note  # how max_context was chosen (kv_budget), said at start
        self.template_timeout = template_timeout(template_timeout_s)
        self.manifest = manifest
        self.art_dir = art_dir
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.metrics = metrics or Metrics()
        if hasattr(decoder, "kv_bytes") and hasattr(decoder, "kv_touched_bytes"):
            self.metrics.kv_reserved = lambda: int(decoder.kv_bytes)
            self.metrics.kv_touched = lambda: int(decoder.kv_touched_bytes)
        self.scheduler = Scheduler(
            decoder, self.decode, max_queue=max_queue, chunk=chunk, metrics=self.metrics
        )

    @property
    def max_context(self) -> int:
        return self.decoder.max_context

    def kv_line(self) -> str:
        """The KV memory the slots reserved and wrote, for the start and stop log lines ("" when
        the decoder does not report it)."""
        reserved, touched = self.metrics.kv_reserved(), self.metrics.kv_touched()
        if reserved is None or touched is None:
            return ""
        return f"KV cache {size_text(reserved)} reserved, {size_text(touched)} touched"

    @functools.cached_property
    def max_prompt_bytes(self) -> int:
        vocab = self.tokenizer.backend.get_vocab(with_added_tokens=True)
        longest = max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=1)
        return self.max_context * max(longest, 4)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.eos_ids)

    def token_text(self, tid: int | None) -> str | None:
        """The token's text as the vocabulary stores it (None for None or an unknown id)."""
        if tid is None:
            return None
        tok = self.tokenizer.backend.id_to_token(int(tid))
        return str(tok) if tok is not None else None

    def encode_text(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template's text for messages (bounded: see runtime.chat_template), with
        `tools` (a 400 naming them when the template does not use them: see serve.tools); the
        template is the model's, or the one `--chat-template` gave."""
        from .tools import check_template, template_messages

        tpl = self.tokenizer.chat_template
        if not tpl:
            raise InputError(
                "the model has no chat template: use /v1/completions, or start the server "
                "with --chat-template"
            )
        check_template(tpl, tools)
        eos = self.tokenizer.eos_ids[0] if self.tokenizer.eos_ids else None
        extra: dict[str, Any] = {} if tools is None else {"tools": tools}
        return render_chat(
            tpl,
            template_messages(list(messages), tpl),
            bos_token=self.token_text(self.tokenizer.bos_id),
            eos_token=self.token_text(eos),
            add_generation_prompt=add_generation_prompt,
            timeout=self.template_timeout,
            **extra,
        )

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def decode_special(self, ids: list[int]) -> str:
        """The text of ids with special tokens written out (the `logprobs` tokens' texts)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @functools.cached_property
    def token_bytes(self) -> Callable[[int], bytes] | None:
        """id -> the token's bytes for a byte-level BPE tokenizer (None for others)."""
        return token_bytes_fn(self.tokenizer.backend)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        added = self.tokenizer.backend.get_added_tokens_decoder()
        return frozenset(i for i, t in added.items() if t.special)


def open_served_model(
    art_dir: str,
    *,
    max_batch: int = 8,
    max_queue: int = 64,
    chunk: int = 32,
    threads: int | None = None,
    max_context: int | None = None,
    name: str | None = None,
    template_timeout_s: float | None = None,
    chat_template: str | None = None,
) -> ServedModel:
    """Open a decoder artifact for serving (`max_batch` KV slots, through its target's
    `open_batch`), after hashing every file it lists against its manifest (a long-running
    server checks the bytes it loads, not only their sizes and times as `llmir run` does
    between unchanged runs). `chat_template`: a built-in name or a file (`--chat-template`),
    loaded and checked before the model, replacing the model's template."""
    from llmir_core.runtime.kv_budget import choose_context
    from llmir_core.targets import open_batch_artifact, read_manifest

    if max_queue < 0:
        raise InputError(f"--max-queue must be >= 0, got {max_queue}")
    if chunk < 1:
        raise InputError(f"--prefill-chunk must be >= 1, got {chunk}")
    template_timeout(template_timeout_s)  # a bad value fails before the model loads
    template = None
    if chat_template is not None:
        from llmir_core.runtime.chat_templates import load_chat_template

        template = load_chat_template(chat_template, template_timeout_s)
    choice = choose_context(read_manifest(art_dir), max_batch, max_context)
    with full_checks():  # a server hashes every file at start, whatever the last check saw
        decoder = open_batch_artifact(
            art_dir, max_batch, threads=threads, max_context=choice.max_context
        )
    manifest = getattr(decoder, "manifest", None) or read_manifest(art_dir)
    tokenizer = load_artifact_tokenizer(art_dir, manifest)
    if template is not None:
        from llmir_core.runtime.chat_templates import with_template

        tokenizer = with_template(tokenizer, template)
    model_name = name or os.path.basename(os.path.normpath(os.path.abspath(art_dir)))
    return ServedModel(
        model_name,
        manifest,
        tokenizer,
        decoder,
        max_queue=max_queue,
        chunk=chunk,
        art_dir=art_dir,
        template_timeout_s=template_timeout_s,
        context_note=choice.line,
    )


__all__ = ["ServedModel", "open_served_model"]
