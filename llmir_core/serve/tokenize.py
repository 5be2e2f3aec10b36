"""vLLM's tokenizer endpoints, which lm-evaluation-harness's `remote` tokenizer uses: the
model's own tokenizer over HTTP, so a client needs no copy of it.

- `POST /tokenize` `{"prompt": str, "add_special_tokens": bool = true, "model"?: str}` ->
  `{"count", "max_model_len", "tokens"}` (the ids `/v1/completions` would give the same text
  when `add_special_tokens` is true).
- `POST /detokenize` `{"tokens": [int], "model"?: str}` -> `{"prompt"}` (special tokens written
  out, as a Hugging Face tokenizer's `decode` does by default).
- `GET /tokenizer_info` -> `eos_token`, `bos_token`, `pad_token`, `chat_template`,
  `model_max_length`, `vocab_size`.

Bodies are parsed with the completions' guards (`prepare.parse_body`); any other parameter is
400 `unsupported_parameter`. No context bound: a text longer than the context still tokenizes
(lm-eval splits long documents itself); the 1 MiB body limit bounds the work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .prepare import parse_body
from .schemas import APIError, bad

if TYPE_CHECKING:
    from .model import ServedModel


def _body(model: ServedModel, raw: bytes, known: set[str]) -> dict[str, Any]:
    body = parse_body(raw)
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    extra = sorted(set(body) - known - {"model"})
    if extra:
        raise bad(
            extra[0], f"'{extra[0]}' is not supported by this endpoint", "unsupported_parameter"
        )
    name = body.get("model")
    if name is not None and name != model.name:
        raise APIError(
            404,
            f"the model '{name}' does not exist (this server has '{model.name}')",
            param="model",
            code="model_not_found",
        )
    return body


def tokenize(model: ServedModel, raw: bytes) -> dict[str, Any]:
    body = _body(model, raw, {"prompt", "add_special_tokens"})
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad(
            "prompt",
            "'prompt' must be a string",
            "missing_required_parameter" if prompt is None else "invalid_type",
        )
    special = body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise bad("add_special_tokens", "'add_special_tokens' must be a boolean", "invalid_type")
    ids = model.tokenizer.encode(prompt, add_special_tokens=special)
    return {"count": len(ids), "max_model_len": model.max_context, "tokens": ids}


def detokenize(model: ServedModel, raw: bytes) -> dict[str, Any]:
    body = _body(model, raw, {"tokens"})
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise bad(
            "tokens",
            "'tokens' must be a list of token ids",
            "missing_required_parameter" if tokens is None else "invalid_type",
        )
    vocab = model.decoder.vocab
    wrong = next((t for t in tokens if not 0 <= t < vocab), None)
    if wrong is not None:
        raise bad("tokens", f"token id {wrong} is out of the vocabulary [0, {vocab})")
    return {"prompt": model.decode_special(tokens)}


def tokenizer_info(model: ServedModel) -> dict[str, Any]:
    tok = model.tokenizer
    return {
        "eos_token": model.token_text(tok.eos_ids[0] if tok.eos_ids else None),
        "bos_token": model.token_text(tok.bos_id),
        "pad_token": None,
        "chat_template": tok.chat_template or None,
        "model_max_length": model.max_context,
        "vocab_size": model.decoder.vocab,
    }


__all__ = ["tokenize", "detokenize", "tokenizer_info"]
