"""Generated text reaches the terminal as exact UTF-8, decoded as characters complete: no U+FFFD
for a character split across tokens or for invalid bytes (shown `\\xNN`), and control
characters, noncharacters and U+FFFD escaped (llmir_core/runtime/textstream.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from llmir_core.runtime.generate import generate
from llmir_core.runtime.sampling import Sampler, SamplingConfig
from llmir_core.runtime.textstream import decode_tokens, decode_utf8, display_safe, token_bytes_fn


@pytest.mark.parametrize(
    "raw, shown",
    [
        (b"plain text\n\tok", "plain text\n\tok"),
        ("naïve €5 日本 😀".encode(), "naïve €5 日本 😀"),
        (b"\xe2\x82", "\ufffd"),  # incomplete: marked for the generation loop to hold back
        (b"a\xffb", "a\\xffb"),  # never valid: escaped, not U+FFFD
        (b"\x1b[31mred\x07\x7f\xc2\x9b", "\\x1b[31mred\\x07\\x7f\\x9b"),  # ESC, BEL, DEL, C1 CSI
        (
            "\ufdd0\ufffe\U0001ffff\ufffd".encode(),
            "\\ufdd0\\ufffe\\U0001ffff\\ufffd",
        ),  # nonchars, U+FFFD
    ],
)
def test_decode_utf8(raw: bytes, shown: str) -> None:
    assert decode_utf8(raw) == shown
    assert display_safe(shown) == shown  # escaping is idempotent on its own output


def _byte_level_tokenizer():  # type: ignore[no-untyped-def]
    tk = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    t = tk.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens(["<|end|>"])
    return t


def test_byte_level_tokens_decode_from_their_bytes() -> None:
    t = _byte_level_tokenizer()
    fn = token_bytes_fn(t)
    assert fn is not None
    ids = t.encode("€ ok").ids  # "€" is three byte tokens
    assert len(ids) == 6
    assert decode_tokens(ids, fn, t.decode) == t.decode(ids) == "€ ok"
    assert decode_tokens(ids[:2], fn, t.decode) == "\ufffd"  # split: held back, not garbage
    assert "\ufffd" in t.decode(ids[:2])  # what the tokenizer itself would have printed
    end = t.token_to_id("<|end|>")
    assert fn(end) == b"" and decode_tokens([*ids, end], fn, t.decode) == "€ ok"


@dataclass
class _Scripted:
    """A decoder whose next token is the next id of a script."""

    script: list[int]
    vocab: int
    max_context: int | None = None
    length: int = 0

    def reset(self, batch: int = 1) -> None:
        self.length = 0

    def forward(self, ids: np.ndarray) -> np.ndarray:
        step = self.length
        self.length += ids.shape[1]
        logits = np.zeros((1, ids.shape[1], self.vocab), np.float32)
        logits[0, -1, self.script[min(step, len(self.script) - 1)]] = 1.0
        return logits


def test_a_random_models_bytes_stream_without_replacement_characters() -> None:
    t = _byte_level_tokenizer()
    fn = token_bytes_fn(t)
    byte_id = {b: t.token_to_id(c) for c, b in _byte_map().items()}
    raw = "ok €".encode() + b"\xff\x1b[2J" + "\ufdd0!".encode()
    script = [byte_id[b] for b in raw]

    class Codec:
        def encode(self, text: str) -> list[int]:
            return t.encode(text).ids

        def decode(self, ids: list[int]) -> str:
            return decode_tokens(ids, fn, t.decode)

    pieces: list[str] = []
    res = generate(
        _Scripted(script, t.get_vocab_size()),
        Codec(),
        [byte_id[ord("a")]],
        max_new_tokens=len(script),
        sampler=Sampler(SamplingConfig()),
        on_text=pieces.append,
    )
    assert res.ids == script
    assert "".join(pieces) == res.text == "ok €\\xff\\x1b[2J\\ufdd0!"
    assert not any("\ufffd" in p for p in pieces)


def _byte_map() -> dict[str, int]:
    from llmir_core.runtime.textstream import byte_of_char

    return byte_of_char()
