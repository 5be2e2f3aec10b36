"""GGUF tokenizer models beyond byte-level BPE and SentencePiece BPE, as `tokenizers` objects.

- `bert` (llama.cpp's WPM): WordPiece over a vocabulary the converter stored in "phantom space"
  form (`▁word` starts a word, a bare piece continues one; `[CLS]`-style tokens as they are),
  rebuilt to WordPiece's `##` form; BERT's normalizer (lower case unless
  `tokenizer.ggml.lowercase` is false) and punctuation / CJK splitting.
- `t5` (llama.cpp's UGM): a Unigram model over the piece scores, the SentencePiece normalizer
  (`tokenizer.ggml.precompiled_charsmap` when present), `▁` for spaces with a leading one.
- `gemma4`: BPE over raw UTF-8 with `▁` for spaces and `<0xNN>` byte fallback, text split only at
  newline runs (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4).

Each returns a tokenizer without special-token handling; `tokenizer.from_gguf_metadata` adds the
control tokens and llama.cpp's BOS/EOS/SEP rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmir_core.errors import InputError

_UNKNOWN, _CONTROL, _BYTE = 2, 3, 6


def _types(meta: dict[str, Any], n: int) -> list[int]:
    raw = meta.get("token_type")
    return [int(t) for t in raw] if raw is not None else [1] * n


def _unk_id(meta: dict[str, Any], types: list[int], default: int | None) -> int | None:
    if meta.get("unknown_token_id") is not None:
        return int(meta["unknown_token_id"])
    return next((i for i, t in enumerate(types) if t == _UNKNOWN), default)


def wpm(tk: Any, meta: dict[str, Any], tokens: list[str]) -> Any:
    """BERT WordPiece from llama.cpp's phantom-space vocabulary."""
    types = _types(meta, len(tokens))
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if types[i] == _CONTROL or (tok.startswith("[") and tok.endswith("]")):
            piece = tok
        elif tok.startswith("\u2581"):
            piece = tok[1:]
        else:
            piece = "##" + tok
        vocab.setdefault(piece, i)
    unk = _unk_id(meta, types, 100 if len(tokens) > 100 else None)
    if unk is None:
        raise InputError(
            f"{meta.get('path', 'the GGUF file')}: a bert vocabulary needs an unknown token",
            hint="set tokenizer.ggml.unknown_token_id",
        )
    t = tk.Tokenizer(
        tk.models.WordPiece(vocab, unk_token=tokens[unk], max_input_chars_per_word=100)
    )
    lower = bool(meta.get("lowercase", True))
    strip = bool(meta.get("strip_accents", lower))
    t.normalizer = tk.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip, lowercase=lower
    )
    t.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    t.decoder = tk.decoders.WordPiece(prefix="##", cleanup=True)
    return t


def ugm(tk: Any, meta: dict[str, Any], tokens: list[str]) -> Any:
    """T5's SentencePiece Unigram model."""
    types = _types(meta, len(tokens))
    scores = meta.get("scores")
    if scores is None or len(scores) < len(tokens):
        raise InputError(
            f"{meta.get('path', 'the GGUF file')}: metadata field 'tokenizer.ggml.scores' "
            "is missing or short: a t5 (Unigram) vocabulary needs one score per token"
        )
    unk = _unk_id(meta, types, 2 if len(tokens) > 2 else None)
    model = tk.models.Unigram(
        [(tok, float(scores[i])) for i, tok in enumerate(tokens)], unk, byte_fallback=_BYTE in types
    )
    t = tk.Tokenizer(model)
    norm = []
    charsmap = meta.get("precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        norm.append(tk.normalizers.Precompiled(bytes(int(b) & 0xFF for b in charsmap)))
    if meta.get("remove_extra_whitespaces", True):
        norm += [
            tk.normalizers.Replace(tk.Regex(" {2,}"), " "),
            tk.normalizers.Strip(left=True, right=True),
        ]
    if norm:
        t.normalizer = tk.normalizers.Sequence(norm)
    scheme = "always" if meta.get("add_space_prefix", True) else "never"
    t.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    t.decoder = tk.decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    return t


def gemma4(tk: Any, meta: dict[str, Any], tokens: list[str]) -> Any:
    """Gemma 4's BPE: spaces as ▁, merges over characters, bytes as <0xNN>, split at newline runs."""
    merges = [tuple(m.split(" ", 1)) for m in meta.get("merges") or []]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    t = tk.Tokenizer(tk.models.BPE(vocab, merges, byte_fallback=True))
    t.normalizer = tk.normalizers.Replace(" ", "\u2581")
    t.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex("[^\\n]+|[\\n]+"), behavior="isolated")
    t.decoder = tk.decoders.Sequence(
        [tk.decoders.Replace("\u2581", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    )
    return t


BUILDERS: dict[str, Callable[[Any, dict[str, Any], list[str]], Any]] = {
    "bert": wpm,
    "t5": ugm,
    "gemma4": gemma4,
}

__all__ = ["BUILDERS", "wpm", "ugm", "gemma4"]
