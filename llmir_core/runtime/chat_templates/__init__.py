"""`--chat-template NAME|FILE`: a chat template that replaces the model's own.

NAME is one of the built-in templates, the `.jinja` files of this folder (`builtin_names()`);
anything else is read as the path of a Jinja template file (at most `MAX_TEMPLATE_BYTES`,
UTF-8). Either renders exactly as a model's own template does: in the bounded sandbox of
`llmir_core.runtime.chat_template`, with the same work, time and size limits.

A template may declare the tokens that end its turns in a comment, `{#- llmir-stop: TOKEN -#}`
(several: separated by spaces). `with_template` adds each declared token that the vocabulary
holds to the tokenizer's end-of-sequence ids, so generation stops at the end of the model's
turn (Gemma's `<end_of_turn>`) even when the model's metadata names another EOS.

Errors are `InputError` (exit 2): an unknown name that is no file either (the message lists the
built-in names), a file too large or not UTF-8, and a template that fails to render a one-message
conversation (checked when it is loaded, so `llmir serve` refuses it before the model loads).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

from llmir_core.errors import InputError
from llmir_core.runtime.tokenizer import Tokenizer

TEMPLATE_DIR = Path(__file__).resolve().parent
MAX_TEMPLATE_BYTES = 1 << 20  # a chat template file (Hugging Face's largest are ~20 KB)
_STOP = re.compile(r"\{#-?\s*llmir-stop:([^#]*?)-?#\}")


@dataclass(frozen=True)
class ChatTemplate:
    name: str  # the built-in name, or the file's path as given
    text: str
    stop: tuple[str, ...] = ()  # tokens that end a turn (declared with llmir-stop)


def builtin_names() -> list[str]:
    """The built-in template names, sorted."""
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja"))


def declared_stops(text: str) -> tuple[str, ...]:
    """The tokens a template declares with `{#- llmir-stop: TOKEN ... -#}`, in order."""
    return tuple(tok for m in _STOP.finditer(text) for tok in m.group(1).split())


def _read(path: Path, shown: str) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_TEMPLATE_BYTES:
            raise InputError(
                f"--chat-template {shown}: the file has {size} bytes "
                f"(a chat template may have at most {MAX_TEMPLATE_BYTES})"
            )
        with path.open("rb") as f:
            data = f.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"--chat-template {shown}: cannot read it ({exc.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"--chat-template {shown}: not UTF-8 text (byte {exc.start} is not)"
        ) from None


def load_chat_template(spec: str, timeout: float | None = None) -> ChatTemplate:
    """The template `spec` names (a built-in name, else a file), checked by rendering a
    one-message conversation within the sandbox's limits (`timeout`: seconds, as
    --template-timeout)."""
    from llmir_core.runtime.chat_template import render_chat

    names = builtin_names()
    if spec in names:
        path, name = TEMPLATE_DIR / f"{spec}.jinja", spec
    elif spec and os.path.isfile(spec):
        path, name = Path(spec), spec
    else:
        raise InputError(
            f"--chat-template {spec!r}: not a built-in template ({', '.join(names)}) "
            "and no such file"
        )
    text = _read(path, name)
    try:
        render_chat(text, [{"role": "user", "content": "Hello"}], bos_token="<s>", timeout=timeout)
    except InputError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise InputError(
            f"--chat-template {name}: the template does not render: {reason}"
        ) from None
    return ChatTemplate(name, text, declared_stops(text))


def with_template(tok: Tokenizer, template: ChatTemplate) -> Tokenizer:
    """`tok` with `template` as its chat template and the template's declared stop tokens
    (those in the vocabulary) added to its end-of-sequence ids."""
    eos = list(tok.eos_ids)
    for token in template.stop:
        tid = tok.token_to_id(token)
        if tid is not None and tid not in eos:
            eos.append(int(tid))
    return dataclasses.replace(tok, chat_template=template.text, eos_ids=tuple(eos))


__all__ = [
    "ChatTemplate",
    "MAX_TEMPLATE_BYTES",
    "TEMPLATE_DIR",
    "builtin_names",
    "declared_stops",
    "load_chat_template",
    "with_template",
]
