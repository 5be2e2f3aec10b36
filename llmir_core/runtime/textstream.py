"""Generated text made fit for a terminal: exact bytes, decoded as UTF-8 as they complete.

A model (a random-weight one above all) can emit token sequences that are not valid UTF-8, and
characters no terminal should receive raw. `decode_tokens` turns generated ids into text from
the tokens' own bytes (byte-level BPE tokenizers: GPT-2, Llama 3, Qwen2, SmolLM), with an
incremental UTF-8 decoder: a character split across tokens appears once it is complete, an
incomplete one at the end is marked with U+FFFD (the generation loop holds that back until the
next token completes it), and bytes that can never form a character are shown as `\\xNN`
instead of being replaced by U+FFFD. `display_safe` then escapes what a terminal would act on
or cannot show: control characters other than newline and tab (`\\x1b`, `\\x7f`, C1 controls),
Unicode noncharacters (U+FDD0..U+FDEF, U+xFFFE, U+xFFFF) and U+FFFD itself (`\\ufffd`).

Tokenizers whose decoder is not byte-level keep the tokenizer's own decoding, made display-safe
the same way.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any


@cache
def byte_of_char() -> dict[str, int]:
    """The inverse of GPT-2's bytes-to-unicode table, which byte-level BPE vocabularies use."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def _is_noncharacter(cp: int) -> bool:
    return 0xFDD0 <= cp <= 0xFDEF or (cp & 0xFFFE) == 0xFFFE


def _escape(ch: str) -> str:
    cp = ord(ch)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def display_safe(text: str) -> str:
    """`text` with control characters (but newline and tab), noncharacters and U+FFFD escaped."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        cp = ord(ch)
        unsafe = (
            (cp < 0x20 and ch not in "\n\t")
            or 0x7F <= cp < 0xA0
            or cp == 0xFFFD
            or _is_noncharacter(cp)
        )
        out.append(_escape(ch) if unsafe else ch)
    return "".join(out)


def decode_utf8(data: bytes) -> str:
    """Bytes to text: invalid bytes as `\\xNN`, an incomplete character at the end as U+FFFD."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")
    text = dec.decode(data, final=False)
    pending = dec.getstate()[0]
    return display_safe(text) + ("\ufffd" if pending else "")


def token_bytes_fn(backend: Any) -> Callable[[int], bytes] | None:
    """id -> the token's bytes for a byte-level BPE tokenizer (special tokens: no bytes); None
    when the tokenizer's decoder is not byte-level."""
    try:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
    except (ValueError, AttributeError):
        return None
    kinds = {decoder.get("type")} | {
        d.get("type") for d in decoder.get("decoders") or () if isinstance(d, dict)
    }
    if "ByteLevel" not in kinds:
        return None
    table = byte_of_char()
    special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    cache: dict[int, bytes] = {}

    def token_bytes(i: int) -> bytes:
        if i not in cache:
            piece = backend.id_to_token(i)
            if i in special or piece is None:
                cache[i] = b""
            elif all(c in table for c in piece):
                cache[i] = bytes(table[c] for c in piece)
            else:  # an added token stored as plain text
                cache[i] = piece.encode("utf-8", errors="surrogatepass")
        return cache[i]

    return token_bytes


def decode_tokens(
    ids: Sequence[int],
    token_bytes: Callable[[int], bytes] | None,
    fallback: Callable[[list[int]], str],
) -> str:
    """Display-safe text of generated ids (see the module docstring)."""
    if token_bytes is None:
        text = fallback(list(ids))
        tail = text.endswith("\ufffd")
        return display_safe(text[:-1] if tail else text) + ("\ufffd" if tail else "")
    return decode_utf8(b"".join(token_bytes(i) for i in ids))


def decode_text(
    ids: Sequence[int],
    token_bytes: Callable[[int], bytes] | None,
    fallback: Callable[[list[int]], str],
) -> str:
    """The exact text of generated ids, for output that escapes it itself (JSON): nothing is
    escaped; bytes that are not UTF-8 become U+FFFD (an incomplete character at the end too,
    which the generation loop holds back as with `decode_tokens`)."""
    if token_bytes is None:
        return fallback(list(ids))
    return b"".join(token_bytes(i) for i in ids).decode("utf-8", errors="replace")
