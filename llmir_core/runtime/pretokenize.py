"""llama.cpp's GGUF pre-tokenizers and special-token defaults, as data.

A byte-level BPE vocabulary in GGUF (`tokenizer.ggml.model = gpt2`) names its split rules in
`tokenizer.ggml.pre`. llama.cpp maps each name to a *kind* and each kind to a list of regular
expressions applied in sequence: every expression splits each piece left by the previous one
into its matches and the text between them (both kept). `PRE_TOKENIZERS` holds those lists as
llama.cpp's `llm_tokenizer_bpe` defines them (src/llama-vocab.cpp), in the syntax of the
Oniguruma engine the `tokenizers` library uses, and `PRE_NAMES` the names of the families llmir
reads. `special_tokens` applies llama.cpp's rules for the BOS/EOS ids, whether BOS/EOS are
added, and the end-of-generation set, when the GGUF keys are absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# GPT-2's split (llama.cpp leaves out the final `|\s+`: unmatched text is kept as a piece anyway)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# DeepSeek LLM's cased-letter class, code point by code point as llama.cpp spells it
_DEEPSEEK_LETTER_RANGES = (
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xB5, 0xB5),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x1BA),
    (0x1BC, 0x1BF),
    (0x1C4, 0x293),
    (0x295, 0x2AF),
    (0x370, 0x373),
    (0x376, 0x377),
    (0x37B, 0x37D),
    (0x37F, 0x37F),
    (0x386, 0x386),
    (0x388, 0x38A),
    (0x38C, 0x38C),
    (0x38E, 0x3A1),
    (0x3A3, 0x3F5),
    (0x3F7, 0x481),
    (0x48A, 0x52F),
    (0x531, 0x556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
)


def _char_class(ranges: tuple[tuple[int, int], ...]) -> str:
    # letters only: none is special inside a character class
    return "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in ranges)


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer kind: its split regexes and the flags it sets."""

    kind: str  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_* name, lower case
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a piece that is a whole vocabulary token is not merged
    add_bos: bool = False  # llama.cpp's add_bos when tokenizer.ggml.add_bos_token is absent
    nfc: bool = False  # NFC-normalize first, as the family's HF tokenizer.json does
    notes: str = ""


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    p.kind: p
    for p in (
        PreTokenizer("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
        PreTokenizer("gpt2", (_GPT2,)),
        PreTokenizer("mpt", (_GPT2,)),
        PreTokenizer("llama3", (_LLAMA3,), ignore_merges=True, add_bos=True),
        PreTokenizer("qwen2", (_QWEN2,), nfc=True),
        PreTokenizer("qwen35", (_QWEN35,), nfc=True),
        PreTokenizer(
            "deepseek-llm",
            (
                "[\r\n]",
                r"\s?[" + _char_class(_DEEPSEEK_LETTER_RANGES) + "]+",
                "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                r"\s+$",
                _CJK,
                r"\p{N}+",
            ),
        ),
        PreTokenizer("deepseek-coder", ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
        PreTokenizer("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
        PreTokenizer("starcoder", (r"\p{N}", _GPT2)),
        PreTokenizer("refact", (r"\p{N}", _GPT2)),
        PreTokenizer("command-r", (r"\p{N}", _GPT2)),
        PreTokenizer("smollm", (r"\p{N}", _GPT2)),
    )
}

# tokenizer.ggml.pre -> kind, for the families llmir reads (llama.cpp's llama_vocab::load)
PRE_NAMES: dict[str, str] = {
    "default": "default",
    "gpt-2": "gpt2",
    "gpt2": "gpt2",
    "phi-2": "gpt2",
    "mpt": "mpt",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "llama-bpe": "llama3",
    "falcon3": "llama3",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
    "megrez": "qwen2",
    "qwen35": "qwen35",
    "deepseek-llm": "deepseek-llm",
    "deepseek-coder": "deepseek-coder",
    "falcon": "falcon",
    "starcoder": "starcoder",
    "refact": "refact",
    "command-r": "command-r",
    "smollm": "smollm",
    "dbrx": "llama3-regex",
    "smaug-bpe": "llama3-regex",
}
# dbrx / smaug-bpe split like llama3 but keep llama.cpp's plain flags (no ignore_merges, no BOS)
PRE_TOKENIZERS["llama3-regex"] = PreTokenizer("llama3-regex", (_LLAMA3,))

SUPPORTED_PRE = tuple(sorted(PRE_NAMES))


def pre_tokenizer(name: str | None) -> PreTokenizer | None:
    """The kind a `tokenizer.ggml.pre` value names (absent: llama.cpp's 'default'); None if unknown."""
    kind = PRE_NAMES.get(name or "default")
    return PRE_TOKENIZERS[kind] if kind else None


def splitter(tk: Any, pre: PreTokenizer) -> Any:
    """A `tokenizers` pre-tokenizer that splits text into the pieces llama.cpp's regexes give."""
    pt = tk.pre_tokenizers
    return pt.Sequence(
        [pt.Split(tk.Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
    )


def build_pre_tokenizer(tk: Any, pre: PreTokenizer) -> Any:
    """`splitter`, then each piece's bytes mapped to GPT-2's byte alphabet."""
    pt = tk.pre_tokenizers
    return pt.Sequence([splitter(tk, pre), pt.ByteLevel(add_prefix_space=False, use_regex=False)])


# -- special tokens -------------------------------------------------------------------------------

# tokenizer.ggml.model -> (default BOS id, default EOS id, add_bos, add_eos, add_sep)
_MODEL_DEFAULTS: dict[str, tuple[int | None, int | None, bool, bool, bool]] = {
    "llama": (1, 2, True, False, False),
    "gpt2": (11, 11, False, False, False),
    "bert": (101, None, True, False, True),
    "t5": (None, 1, False, True, False),
    "gemma4": (None, None, True, False, False),
}
# token texts llama.cpp treats as end of generation whatever their type
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)


@dataclass
class SpecialTokens:
    """What llama.cpp adds around a prompt and where it stops generating."""

    bos_id: int | None
    eos_id: int | None
    sep_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    eog_ids: tuple[int, ...] = field(default_factory=tuple)


def _key_id(meta: dict[str, Any], key: str, default: int | None, n: int) -> int | None:
    if default is not None and not 0 <= default < n:
        default = None  # llama.cpp disables a default id outside the vocabulary
    v = meta.get(key)
    if v is None or isinstance(v, bool) or not 0 <= int(v) < n:
        return default
    return int(v)


def special_tokens(meta: dict[str, Any]) -> SpecialTokens:
    """llama.cpp's special-token rules for GGUF `tokenizer.ggml.*` fields (as read_tokenizer gives)."""
    model = str(meta.get("model") or "")
    tokens = [str(t) for t in meta.get("tokens") or ()]
    n = len(tokens)
    bos0, eos0, add_bos, add_eos, add_sep = _MODEL_DEFAULTS.get(
        model, (None, None, False, False, False)
    )
    if model == "gpt2":
        pre = pre_tokenizer(meta.get("pre"))
        add_bos = bool(pre and pre.add_bos)
    st = SpecialTokens(
        _key_id(meta, "bos_token_id", bos0, n),
        _key_id(meta, "eos_token_id", eos0, n),
        _key_id(meta, "seperator_token_id", 102 if model == "bert" else None, n),
    )
    add_bos = bool(meta["add_bos_token"]) if meta.get("add_bos_token") is not None else add_bos
    add_eos = bool(meta["add_eos_token"]) if meta.get("add_eos_token") is not None else add_eos
    add_sep = bool(meta["add_sep_token"]) if meta.get("add_sep_token") is not None else add_sep
    if model == "gemma4":
        add_bos = True  # llama.cpp overrides a false add_bos_token for Gemma 4
    st.add_bos, st.add_eos, st.add_sep = add_bos, add_eos, add_sep
    st.eog_ids = _eog_ids(meta, tokens, st.eos_id)
    return st


def _eog_ids(meta: dict[str, Any], tokens: list[str], eos: int | None) -> tuple[int, ...]:
    n = len(tokens)
    eog = [i for i, t in enumerate(tokens) if t in EOG_TEXTS]
    texts = {tokens[i] for i in eog}
    if "<|end|>" in texts and (
        ("<|return|>" in texts and "<|call|>" in texts)
        or ("<|calls|>" in texts and "<|flush|>" in texts)
    ):
        eog = [i for i in eog if tokens[i] != "<|end|>"]  # harmony / solar-open: <|end|> is not EOG
    if "<|tool_response>" in texts:
        eog = [i for i in eog if tokens[i] != "</s>"]  # gemma4
    first = [eos, _key_id(meta, "eot_token_id", None, n), _key_id(meta, "eom_token_id", None, n)]
    return tuple(dict.fromkeys(i for i in [*first, *eog] if i is not None))


__all__ = [
    "PreTokenizer",
    "PRE_TOKENIZERS",
    "PRE_NAMES",
    "SUPPORTED_PRE",
    "pre_tokenizer",
    "build_pre_tokenizer",
    "splitter",
    "SpecialTokens",
    "special_tokens",
    "EOG_TEXTS",
]
