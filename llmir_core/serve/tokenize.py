"""The tokenizer endpoints of vLLM and llama.cpp's server: the model's own tokenizer over HTTP, so
a client (lm-evaluation-harness's `remote` tokenizer, a llama.cpp client) needs no copy of it.

`POST /tokenize` takes three bodies, told apart by their fields:

- vLLM, text: `{"prompt": str, "add_special_tokens": bool = true, "return_token_strs"?: bool}`
  -> `{"count", "max_model_len", "tokens"}` (the ids `/v1/completions` gives the same text when
  `add_special_tokens` is true), plus `"token_strs"` (each token as the vocabulary stores it).
- vLLM, chat: `{"messages": [...], "add_generation_prompt": bool = true, "add_special_tokens":
  bool = false, "return_token_strs"?: bool}`: the messages rendered with the chat template in
  use (the model's or `--chat-template`), then tokenized; the same answer. With the defaults the
  ids are the prompt `/v1/chat/completions` feeds the model.
- llama.cpp: `{"content": str, "add_special": bool = false, "with_pieces": bool = false}` ->
  `{"tokens": [id, ...]}`, or with `with_pieces` `{"tokens": [{"id", "piece"}, ...]}` where a
  piece is the token's text, or its bytes as a list of integers when they are not UTF-8 alone.

`POST /detokenize` `{"tokens": [int]}` -> `{"prompt", "content"}`: the text (special tokens
written out, as a Hugging Face tokenizer's `decode` does by default) under vLLM's name and
llama.cpp's.

`GET /tokenizer_info` -> what lm-evaluation-harness's `RemoteTokenizer` reads: `eos_token`,
`bos_token` (each encodes back to its id), `pad_token` (null: the artifact names none),
`chat_template` (the template in use, rendered by lm-eval with `messages` and
`add_generation_prompt`), plus `model_max_length` and `vocab_size`.

Bodies are parsed with the completions' guards (`prepare.parse_body`); a field of another form
is 400 `unsupported_parameter`. No context bound: a text longer than the context still tokenizes
(lm-eval splits long documents itself); the 1 MiB body limit bounds the work.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from llmir_core.errors import InputError

from .prepare import parse_body
from .schemas import APIError, bad, parse_chat

if TYPE_CHECKING:
    from .model import ServedModel

_VLLM_TEXT = {"prompt", "add_special_tokens", "return_token_strs"}
_VLLM_CHAT = {"messages", "add_generation_prompt", "add_special_tokens", "return_token_strs"}
_LLAMA_CPP = {"content", "add_special", "with_pieces"}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _body(model: ServedModel, raw: bytes, known: set[str] | None) -> dict[str, Any]:
    """The body as a dict; `known`: its fields (None: told apart by `_form`)."""
    body = parse_body(raw)
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    if known is None:
        known = _form(body)
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


def _form(body: dict[str, Any]) -> set[str]:
    if "content" in body:
        return _LLAMA_CPP
    return _VLLM_CHAT if "messages" in body else _VLLM_TEXT


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    v = body.get(name, default)
    if not isinstance(v, bool):
        raise bad(name, f"'{name}' must be a boolean", "invalid_type")
    return v


def _text(body: dict[str, Any], name: str) -> str:
    v = body.get(name)
    if not isinstance(v, str):
        raise bad(
            name,
            f"'{name}' must be a string",
            "missing_required_parameter" if v is None else "invalid_type",
        )
    return v


def _chat_text(model: ServedModel, body: dict[str, Any]) -> str:
    """vLLM's chat form: the messages (checked as /v1/chat/completions checks them) rendered."""
    generation_prompt = _flag(body, "add_generation_prompt", True)
    p = parse_chat({"model": model.name, "messages": body["messages"]})
    try:
        return model.render_chat(p.messages or [], add_generation_prompt=generation_prompt)
    except InputError as exc:
        raise APIError(400, str(exc), param="messages", code="invalid_prompt") from None


def tokenize(model: ServedModel, raw: bytes) -> dict[str, Any]:
    body = _body(model, raw, None)
    if "content" in body:
        return _tokenize_llama_cpp(model, body)
    if "messages" in body:
        text, special = _chat_text(model, body), _flag(body, "add_special_tokens", False)
    else:
        text, special = _text(body, "prompt"), _flag(body, "add_special_tokens", True)
    ids = model.tokenizer.encode(text, add_special_tokens=special)
    answer: dict[str, Any] = {"count": len(ids), "max_model_len": model.max_context, "tokens": ids}
    if _flag(body, "return_token_strs", False):
        answer["token_strs"] = [model.token_text(i) for i in ids]
    return answer


def _tokenize_llama_cpp(model: ServedModel, body: dict[str, Any]) -> dict[str, Any]:
    text = _text(body, "content")
    ids = model.tokenizer.encode(text, add_special_tokens=_flag(body, "add_special", False))
    if not _flag(body, "with_pieces", False):
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": piece(model, i)} for i in ids]}


def piece(model: ServedModel, tid: int) -> str | list[int]:
    """A token's text as llama.cpp's /tokenize gives it: the text its bytes spell, or the bytes
    (a list of integers) when they are not valid UTF-8 alone (a piece of a character)."""
    token_bytes = model.token_bytes
    data = token_bytes(tid) if token_bytes is not None and tid not in model.special_ids else None
    if data is None:
        text = model.token_text(tid) or ""
        byte = _BYTE_TOKEN.fullmatch(text)
        data = bytes([int(byte.group(1), 16)]) if byte else text.replace("\u2581", " ").encode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


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
    text = model.decode_special(tokens)
    return {"prompt": text, "content": text}


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


__all__ = ["tokenize", "detokenize", "tokenizer_info", "piece"]
