"""A request body to the prompt's token ids, bounded at every step (runs on a worker thread).

1. The body is parsed as JSON with guards: integers of more than 40 digits, nesting deeper than
   Python's recursion limit and bytes that are not UTF-8 are 400 `invalid_json`, like any other
   malformed body (never a 500).
2. The parameters are checked (`schemas`), and the model name.
3. A **byte bound** before any tokenizing or rendering: no token is longer than the
   tokenizer's longest token, so a text of more than `max_context` x that many UTF-8 bytes
   cannot fit the context; it is 400 `context_length_exceeded` at once. For chat, the
   messages' text is bounded before the template renders, the rendered text after.
4. The chat template renders within its limits (`llmir_core.runtime.chat_template`); any
   template error is 400 `invalid_prompt` naming `messages`.
5. The prompt is tokenized and its length checked against the context. A completion's prompt
   given as token ids is taken as it is (no BOS added), each id checked against the vocabulary;
   a list of prompts is checked one by one, errors naming `prompt[i]`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from llmir_core.errors import InputError

from .sampling_params import check_logit_bias
from .schemas import APIError, GenParams, bad, parse_chat, parse_completion
from .tools import template_tools

if TYPE_CHECKING:
    from .model import ServedModel

MAX_INT_DIGITS = 40


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def parse_body(raw: bytes) -> Any:
    """The decoded JSON body, or APIError 400 invalid_json."""
    try:
        return json.loads(raw, parse_int=_parse_int)
    except RecursionError:
        reason = "it is nested too deeply"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, our integer bound
        reason = str(exc)
    raise APIError(
        400, f"we could not parse the JSON body of your request ({reason})", code="invalid_json"
    )


def _too_long(model: ServedModel, param: str, what: str) -> APIError:
    return APIError(
        400,
        f"this model's maximum context length is {model.max_context} tokens; the {what}",
        param=param,
        code="context_length_exceeded",
    )


def _check_bytes(model: ServedModel, text_bytes: int, param: str, what: str) -> None:
    if text_bytes > model.max_prompt_bytes:
        raise _too_long(
            model,
            param,
            f"{what} has {text_bytes} bytes, more than {model.max_context} tokens can hold "
            f"({model.max_prompt_bytes} bytes)",
        )


def prompt_ids(
    model: ServedModel,
    p: GenParams,
    chat: bool,
    prompt: str | list[int] | None = None,
    param: str = "",
) -> list[int]:
    """The prompt's token ids (chat: the messages'; else `prompt`, a completion's one prompt),
    bounded as the module docstring says."""
    param = param or ("messages" if chat else "prompt")
    if isinstance(prompt, list):
        vocab = model.decoder.vocab
        bad_id = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad_id is not None:
            raise bad(param, f"token id {bad_id} is out of the vocabulary [0, {vocab})")
        ids = list(prompt)
    elif chat:
        messages = p.messages or []
        size = sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in messages)
        _check_bytes(model, size, param, "messages' text")
        try:
            text = model.render_chat(messages, template_tools(p))
        except InputError as exc:
            raise APIError(400, str(exc), param=param, code="invalid_prompt") from None
        _check_bytes(model, len(text.encode("utf-8", "surrogatepass")), param, "rendered chat")
        ids = model.tokenizer.encode(text, add_special_tokens=False)
    else:
        text = prompt or ""
        _check_bytes(model, len(text.encode("utf-8", "surrogatepass")), param, "prompt")
        ids = model.encode_text(text)
    if not ids:
        raise bad(param, "the prompt encodes to no tokens")
    if len(ids) >= model.max_context:
        raise _too_long(
            model, param, f"prompt has {len(ids)} (with room for at least one new token)"
        )
    return ids


def prepare(model: ServedModel, raw: bytes, chat: bool) -> tuple[GenParams, list[list[int]]]:
    """Parse, check and encode one request (the server's worker threads run this): its
    parameters and each prompt's token ids (chat: one)."""
    body = parse_body(raw)
    p = parse_chat(body) if chat else parse_completion(body)
    if p.model != model.name:
        raise APIError(
            404,
            f"the model '{p.model}' does not exist (this server has '{model.name}')",
            param="model",
            code="model_not_found",
        )
    check_logit_bias(p, model.decoder.vocab)
    if chat:
        return p, [prompt_ids(model, p, True)]
    many = len(p.prompts) > 1
    return p, [
        prompt_ids(model, p, False, one, f"prompt[{i}]" if many else "prompt")
        for i, one in enumerate(p.prompts)
    ]


__all__ = ["prepare", "parse_body", "prompt_ids", "MAX_INT_DIGITS"]
