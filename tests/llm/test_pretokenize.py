"""GGUF pre-tokenizers split text as llama.cpp's regexes do, and special tokens follow its defaults.

Three oracles: hand-written splits of llama.cpp's documented regexes (digits, whitespace runs,
contractions, CJK, emoji, code), an independent implementation of llama.cpp's sequential split
(`unicode_regex_split`: every regex splits every piece into matches and gaps) on the `regex`
package, and the HF `tokenizers` pre-tokenizers of the families whose tokenizer.json uses the same
rule (GPT-2 byte level, StarCoder's individual digits).
"""

from __future__ import annotations

from typing import Any

import pytest

from llmir_core.runtime.pretokenize import (
    PRE_NAMES,
    PRE_TOKENIZERS,
    pre_tokenizer,
    special_tokens,
    splitter,
)

tk = pytest.importorskip(
    "tokenizers", reason="the tokenizers package is needed (pip install tokenizers)"
)

TEXTS = [
    "Hello world",
    "I'm he's they'LL WE'D",
    "1234567 x 12 3.14159",
    "a  b   c\t\td\n\n  e \r\n",
    "日本語のテキスト 中文，你好！ 한국어",
    "emoji 🙂🚀 ok 👍🏽",
    "def f(x):\n    return x**2  # sq\n",
    "Ünïcödé naïve café e\u0301x",
    "$+<=>^~|` !? x=1234;",
    "  leading and trailing  ",
    "",
    "Привет, мир! Ωμέγα 42",
]

# (kind, text, llama.cpp's pieces)
EXPECTED = [
    ("gpt2", "1234567 x 12", ["1234567", " x", " 12"]),
    ("gpt2", "I'M he's", ["I", "'", "M", " he", "'s"]),
    ("gpt2", "a  b\n\n c", ["a", " ", " b", "\n\n", " c"]),
    ("mpt", "1234567 x 12", ["1234567", " x", " 12"]),
    ("llama3", "1234567 x 12", ["123", "456", "7", " x", " ", "12"]),
    ("llama3", "I'M he's", ["I", "'M", " he", "'s"]),
    ("llama3", "a  b\n\n c", ["a", " ", " b", "\n\n", " c"]),
    ("qwen2", "1234 x", ["1", "2", "3", "4", " x"]),
    ("qwen2", "e\u0301x", ["e", "\u0301x"]),  # the mark is the optional non-letter prefix
    ("qwen35", "e\u0301x", ["e\u0301x"]),
    ("starcoder", "1234567 x 12", ["1", "2", "3", "4", "5", "6", "7", " x", " ", "1", "2"]),
    ("refact", "x12", ["x", "1", "2"]),
    ("command-r", "it's 42", ["it", "'s", " ", "4", "2"]),
    ("deepseek-coder", "Hello world\n123", ["Hello", " world", "\n", "1", "2", "3"]),
    ("deepseek-coder", "def f(x):", ["def", " f", "(", "x", "):"]),
    ("deepseek-coder", "中文，你好", ["中文", "，", "你好"]),
    ("deepseek-llm", "Hello, 世界 42\n", ["Hello", ",", " ", "世界", " ", "42", "\n"]),
    ("deepseek-llm", "x  \n", ["x", "  ", "\n"]),
    ("falcon", "x=1234;", ["x", "=", "123", "4", ";"]),
    ("falcon", "a`b 12", ["a", "`", "b", " 12"]),
    ("default", "x=1234;", ["x", "=", "123", "4", ";"]),
    ("default", "a `b", ["a", " `", "b"]),  # ` is not in the default punctuation class
    ("falcon", "a `b", ["a", " ", "`", "b"]),
]


def pieces(kind: str, text: str) -> list[str]:
    return [p for p, _ in splitter(tk, PRE_TOKENIZERS[kind]).pre_tokenize_str(text)]


def llama_cpp_split(text: str, regexes: tuple[str, ...]) -> list[str]:
    """llama.cpp's unicode_regex_split: each regex in turn cuts each piece into matches and gaps."""
    regex = pytest.importorskip("regex", reason="the regex package is the independent oracle")
    chunks = [text] if text else []
    for expr in regexes:
        pat = regex.compile(expr)
        out = []
        for c in chunks:
            at = 0
            for m in pat.finditer(c):
                if m.start() == m.end():
                    continue
                if m.start() > at:
                    out.append(c[at : m.start()])
                out.append(m.group())
                at = m.end()
            if at < len(c):
                out.append(c[at:])
        chunks = out
    return chunks


@pytest.mark.parametrize("kind, text, want", EXPECTED)
def test_documented_splits(kind: str, text: str, want: list[str]) -> None:
    assert pieces(kind, text) == want
    assert "".join(want) == text


@pytest.mark.parametrize("kind", sorted(PRE_TOKENIZERS))
def test_splits_match_llama_cpp_algorithm(kind: str) -> None:
    for text in TEXTS:
        assert pieces(kind, text) == llama_cpp_split(text, PRE_TOKENIZERS[kind].regexes), (
            kind,
            text,
        )


@pytest.mark.parametrize(
    "kind, hf",
    [
        ("gpt2", "bytelevel"),
        ("mpt", "bytelevel"),
        ("starcoder", "digits"),
        ("refact", "digits"),
        ("command-r", "digits"),
        ("smollm", "digits"),
    ],
)
def test_splits_match_hf_pre_tokenizers(kind: str, hf: str) -> None:
    """The same rule as HF tokenizer.json spells it (after ByteLevel's byte-to-unicode mapping)."""
    pt = tk.pre_tokenizers
    byte_level = pt.ByteLevel(add_prefix_space=False, use_regex=True)
    ref = (
        byte_level
        if hf == "bytelevel"
        else pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    )
    ours = pt.Sequence(
        [splitter(tk, PRE_TOKENIZERS[kind]), pt.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    for text in TEXTS:
        assert [p for p, _ in ours.pre_tokenize_str(text)] == [
            p for p, _ in ref.pre_tokenize_str(text)
        ], text


def test_issue_families_are_known() -> None:
    for name in (
        "deepseek-llm",
        "deepseek-coder",
        "falcon",
        "mpt",
        "starcoder",
        "refact",
        "command-r",
        "qwen35",
        "llama-bpe",
        "qwen2",
        "smollm",
        "gpt-2",
        "default",
    ):
        assert name in PRE_NAMES and pre_tokenizer(name) is not None
    assert pre_tokenizer(None) is PRE_TOKENIZERS["default"]  # absent: llama.cpp's default
    assert pre_tokenizer("no-such-pre") is None


def _meta(model: str, **kw: Any) -> dict[str, Any]:
    tokens = [f"t{i}" for i in range(20)]
    tokens[5] = "<|eot_id|>"
    return {"model": model, "tokens": tokens, **kw}


def test_bos_eos_defaults() -> None:
    """llama.cpp's defaults when the keys are absent (llama_vocab::impl::load)."""
    st = special_tokens(_meta("gpt2", pre="llama-bpe", bos_token_id=3, eos_token_id=4))
    assert st.add_bos and st.bos_id == 3 and st.eog_ids == (4, 5)  # Llama 3: BOS, <|eot_id|> ends
    st = special_tokens(_meta("gpt2", pre="llama-bpe", bos_token_id=3, add_bos_token=False))
    assert not st.add_bos
    st = special_tokens(_meta("gpt2", pre="qwen2"))
    assert not st.add_bos and st.bos_id == 11 and st.eos_id == 11  # BPE default ids
    st = special_tokens(_meta("llama"))
    assert st.add_bos and not st.add_eos and (st.bos_id, st.eos_id) == (1, 2)
    st = special_tokens(_meta("t5"))
    assert st.add_eos and not st.add_bos and st.bos_id is None and st.eos_id == 1
    st = special_tokens(_meta("bert"))
    assert (
        st.add_bos
        and st.add_sep
        and (st.bos_id, st.sep_id, st.eos_id) == (101 if 101 < 20 else None, None, None)
    )
    st = special_tokens(_meta("llama", eos_token_id=99, eot_token_id=7))
    assert st.eos_id == 2 and st.eog_ids == (
        2,
        7,
        5,
    )  # an id outside the vocabulary keeps the default


def test_bos_added_when_key_absent() -> None:
    """A Llama-3 GGUF without add_bos_token gets BOS, a GPT-2 one does not."""
    from llmir_core.runtime.tokenizer import from_gguf_metadata

    from .test_tokenizer import byte_level_bpe, gguf_vocab

    hf = byte_level_bpe()
    for pre, want_bos in (("llama-bpe", True), ("gpt-2", False), ("starcoder", False)):
        meta = gguf_vocab(hf, "gpt2", pre)
        del meta["add_bos_token"]
        ids = from_gguf_metadata(meta).encode("hello world").ids
        assert (ids[0] == 0) == want_bos, pre
