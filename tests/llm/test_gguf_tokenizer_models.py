"""GGUF `bert` (WordPiece), `t5` (Unigram) and `gemma4` (BPE without byte mapping) vocabularies.

Each tokenizer is trained with the `tokenizers` library in its family's HF layout, written into
GGUF fields as llama.cpp's converter stores them (bert in phantom-space form, t5 with scores,
gemma4 with merges and <0xNN> byte pieces), rebuilt, and must encode and decode like the original.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmir_core.errors import InputError

tk = pytest.importorskip(
    "tokenizers", reason="the tokenizers package is needed (pip install tokenizers)"
)

from .test_tokenizer import CORPUS  # noqa: E402

TEXTS = [
    "Hello World! Ünïcödé 你好，世界 — Привет 12345 x**2\n  tabs\tend",
    "The QUICK brown fox.",
    "naïve café, déjà vu",
    "日本語のテキストです。",
    "a  b   c",
    "emoji 🙂 ok",
]


def _vocab_list(t: Any) -> list[str]:
    vocab = t.get_vocab(with_added_tokens=True)
    out = [""] * len(vocab)
    for piece, i in vocab.items():
        out[i] = piece
    return out


def bert_pair() -> tuple[Any, dict[str, Any]]:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    t = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
    t.normalizer = tk.normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator(
        CORPUS,
        tk.trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials, show_progress=False),
    )
    t.decoder = tk.decoders.WordPiece()
    t.post_processor = tk.processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    pieces = _vocab_list(t)
    tokens = [p if p in specials else p[2:] if p.startswith("##") else "\u2581" + p for p in pieces]
    meta = {
        "model": "bert",
        "tokens": tokens,
        "token_type": [3 if p in specials else 1 for p in pieces],
        "bos_token_id": 2,
        "seperator_token_id": 3,
        "unknown_token_id": 1,
        "padding_token_id": 0,
    }
    return t, meta


def t5_pair() -> tuple[Any, dict[str, Any]]:
    t = tk.Tokenizer(tk.models.Unigram())
    t.normalizer = tk.normalizers.Sequence(
        [tk.normalizers.Replace(tk.Regex(" {2,}"), " "), tk.normalizers.Strip()]
    )
    t.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    t.decoder = tk.decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    t.train_from_iterator(
        CORPUS,
        tk.trainers.UnigramTrainer(
            vocab_size=300,
            special_tokens=["<pad>", "</s>", "<unk>"],
            unk_token="<unk>",
            show_progress=False,
        ),
    )
    t.post_processor = tk.processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    model = json.loads(t.to_str())["model"]["vocab"]
    tokens = [p for p, _ in model]
    types = [3 if p in ("<pad>", "</s>") else 2 if p == "<unk>" else 1 for p in tokens]
    meta = {
        "model": "t5",
        "tokens": tokens,
        "scores": [s for _, s in model],
        "token_type": types,
        "eos_token_id": 1,
        "unknown_token_id": 2,
        "padding_token_id": 0,
        "add_space_prefix": True,
        "remove_extra_whitespaces": True,
    }
    return t, meta


def gemma4_pair() -> tuple[Any, dict[str, Any]]:
    norm = tk.normalizers.Replace(" ", "\u2581")
    split = tk.pre_tokenizers.Split(tk.Regex("[^\\n]+|[\\n]+"), behavior="isolated")
    trainer = tk.Tokenizer(tk.models.BPE())
    trainer.normalizer, trainer.pre_tokenizer = norm, split
    trainer.train_from_iterator(
        CORPUS, tk.trainers.BpeTrainer(vocab_size=420, limit_alphabet=90, show_progress=False)
    )
    j = json.loads(trainer.to_str())
    trained = [p for p, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tokens = (
        specials + [f"<0x{i:02X}>" for i in range(256)] + [p for p in trained if p not in specials]
    )
    vocab = {p: i for i, p in enumerate(tokens)}
    t = tk.Tokenizer(
        tk.models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], byte_fallback=True)
    )
    t.normalizer, t.pre_tokenizer = norm, split
    t.decoder = tk.decoders.Sequence(
        [tk.decoders.Replace("\u2581", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    )
    t.add_special_tokens([tk.AddedToken(s, special=True, normalized=False) for s in specials])
    t.post_processor = tk.processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)]
    )
    types = [3 if p in specials else 6 if p.startswith("<0x") else 1 for p in tokens]
    # add_bos_token false: llama.cpp overrides it for Gemma 4
    meta = {
        "model": "gemma4",
        "tokens": tokens,
        "token_type": types,
        "merges": merges,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "add_bos_token": False,
    }
    return t, meta


@pytest.mark.parametrize("make", [bert_pair, t5_pair, gemma4_pair], ids=["bert", "t5", "gemma4"])
def test_rebuilt_model_matches(make: Any) -> None:
    from llmir_core.runtime.tokenizer import from_gguf_metadata

    hf, meta = make()
    rebuilt = from_gguf_metadata(meta)
    for text in TEXTS + CORPUS[:8]:
        want = hf.encode(text).ids
        assert rebuilt.encode(text).ids == want, text
        assert rebuilt.decode(want) == hf.decode(want), text
    assert len(hf.encode(TEXTS[0]).ids) > 15


def test_special_tokens_per_model() -> None:
    from llmir_core.runtime.tokenizer import from_gguf_metadata

    _, meta = bert_pair()
    ids = from_gguf_metadata(meta).encode("hello").ids
    assert ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP]
    _, meta = t5_pair()
    assert from_gguf_metadata(meta).encode("hello").ids[-1] == 1  # ... </s>
    _, meta = gemma4_pair()
    assert (
        from_gguf_metadata(meta).encode("hello").ids[0] == 2
    )  # <bos> although add_bos_token is false


def test_model_errors() -> None:
    from llmir_core.runtime.tokenizer import from_gguf_metadata

    _, meta = t5_pair()
    del meta["scores"]
    with pytest.raises(InputError, match=r"'tokenizer\.ggml\.scores' is missing or short"):
        from_gguf_metadata(meta)
    with pytest.raises(
        InputError, match=r"'tokenizer\.ggml\.model' is 'rwkv', which is not supported"
    ):
        from_gguf_metadata({"model": "rwkv", "tokens": ["a"]})
    _, meta = bert_pair()
    meta.pop("unknown_token_id")
    meta["token_type"] = [1] * len(meta["tokens"])
    meta["tokens"] = meta["tokens"][:50]
    meta["token_type"] = meta["token_type"][:50]
    with pytest.raises(InputError, match=r"a bert vocabulary needs an unknown token"):
        from_gguf_metadata(meta)
