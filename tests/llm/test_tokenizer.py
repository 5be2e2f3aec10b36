"""Tokenizers rebuilt from GGUF metadata encode and decode like the HF tokenizer they came from.

Two small tokenizers are trained with the `tokenizers` library on a multilingual corpus: a
byte-level BPE with Llama 3's pre-tokenizer (GGUF `gpt2` / `llama-bpe`) and a SentencePiece-style
BPE with byte fallback (GGUF `llama`). Their vocabularies are written to GGUF the way llama.cpp's
converter does (tokens by id, token types, merges or scores), imported, and rebuilt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmir_core.errors import InputError

tk = pytest.importorskip(
    "tokenizers", reason="the tokenizers package is needed (pip install tokenizers)"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. 1234567 numbers!",
    "Größere Äpfel über Straßen — naïve café, déjà vu.",
    "Привет, как дела? Всё хорошо.",
    "日本語のテキストです。東京は大きい。",
    "中文文本测试，你好世界！",
    "مرحبا بالعالم",
    "  spaces\tand\nnewlines\r\n ok",
    "emoji 🙂🚀 and code: def f(x): return x**2",
] * 10
TEXTS = [
    "Hello wörld! Ünïcödé 你好，世界 — Привет мир 🙂 12345 x**2\n  tabs\tend",
    "<|begin|>system\nÜber 日本 données<|end|> after",
    "Ωμέγα ελληνικά ᚠᚢᚦ 한국어 텍스트",
    "",
]
LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_level_bpe(pre: str = "llama-bpe") -> Any:
    """A byte-level BPE with the pre-tokenizer the HF tokenizer.json of that family uses."""
    pt = tk.pre_tokenizers
    t = tk.Tokenizer(tk.models.BPE(ignore_merges=pre == "llama-bpe"))
    if pre in ("llama-bpe", "qwen2"):
        t.pre_tokenizer = pt.Sequence(
            [
                pt.Split(
                    tk.Regex(LLAMA3_RE if pre == "llama-bpe" else QWEN2_RE), behavior="isolated"
                ),
                pt.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre in ("smollm", "starcoder", "refact", "command-r"):
        t.pre_tokenizer = pt.Sequence(
            [pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False)]
        )
    elif pre in (
        "deepseek-coder",
        "deepseek-llm",
    ):  # their tokenizer.json: a Sequence of Split regexes
        from llmir_core.runtime.pretokenize import pre_tokenizer

        spec = pre_tokenizer(pre)
        assert spec is not None
        t.pre_tokenizer = pt.Sequence(
            [pt.Split(tk.Regex(r), behavior="isolated") for r in spec.regexes]
            + [pt.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    else:
        t.pre_tokenizer = pt.ByteLevel(add_prefix_space=False)
    if pre == "qwen2":
        t.normalizer = tk.normalizers.NFC()
    t.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|begin|>", "<|end|>"],
        initial_alphabet=pt.ByteLevel.alphabet(),
        show_progress=False,
    )
    t.train_from_iterator(CORPUS, trainer)
    t.post_processor = tk.processors.TemplateProcessing(
        single="<|begin|> $A", pair="<|begin|> $A <|begin|> $B", special_tokens=[("<|begin|>", 0)]
    )
    return t


def sentencepiece_bpe() -> Any:
    """Llama-2 style: ▁ for spaces, BPE with byte fallback over <0xNN> pieces, <s> prepended."""
    norm = tk.normalizers.Sequence([tk.normalizers.Prepend("▁"), tk.normalizers.Replace(" ", "▁")])
    t = tk.Tokenizer(tk.models.BPE())
    t.normalizer = norm
    t.pre_tokenizer = tk.pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="never", split=True
    )
    t.train_from_iterator(
        CORPUS, tk.trainers.BpeTrainer(vocab_size=450, limit_alphabet=100, show_progress=False)
    )
    j = json.loads(t.to_str())
    trained = [p for p, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [
        tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]
    ]
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + trained
    vocab = {p: i for i, p in enumerate(pieces)}
    hf = tk.Tokenizer(
        tk.models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    hf.normalizer = norm
    hf.decoder = tk.decoders.Sequence(
        [
            tk.decoders.Replace("▁", " "),
            tk.decoders.ByteFallback(),
            tk.decoders.Fuse(),
            tk.decoders.Strip(" ", 1, 0),
        ]
    )
    hf.add_special_tokens(
        [tk.AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")]
    )
    hf.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return hf


def gguf_vocab(hf: Any, model: str, pre: str = "llama-bpe") -> dict[str, Any]:
    """The tokenizer.ggml.* fields llama.cpp's converter writes for this tokenizer."""
    j = json.loads(hf.to_str())
    vocab = j["model"]["vocab"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["id"] for a in j["added_tokens"] if a["special"]}
    meta: dict[str, Any] = {"model": model, "tokens": tokens}
    if model == "gpt2":
        meta.update(
            pre=pre,
            token_type=[3 if i in special else 1 for i in range(len(tokens))],
            merges=[" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]],
            bos_token_id=0,
            eos_token_id=1,
            add_bos_token=True,
        )
    else:
        types = [
            2 if t == "<unk>" else 3 if i in special else 6 if t.startswith("<0x") else 1
            for i, t in enumerate(tokens)
        ]
        # SentencePiece scores: pieces in merge order, best first (bytes and controls score 0)
        scores = [0.0 if ty != 1 else -float(i) for i, ty in enumerate(types)]
        meta.update(
            token_type=types,
            scores=scores,
            bos_token_id=1,
            eos_token_id=2,
            unknown_token_id=0,
            add_bos_token=True,
            add_space_prefix=True,
        )
    return meta


@pytest.mark.parametrize(
    "kind, pre",
    [
        ("gpt2", "llama-bpe"),
        ("gpt2", "qwen2"),
        ("gpt2", "smollm"),
        ("gpt2", "gpt-2"),
        ("gpt2", "mpt"),
        ("gpt2", "starcoder"),
        ("gpt2", "refact"),
        ("gpt2", "command-r"),
        ("gpt2", "deepseek-coder"),
        ("gpt2", "deepseek-llm"),
        ("llama", ""),
    ],
)
def test_rebuilt_tokenizer_matches(kind: str, pre: str) -> None:
    from llmir_core.runtime.tokenizer import from_gguf_metadata

    hf = byte_level_bpe(pre) if kind == "gpt2" else sentencepiece_bpe()
    rebuilt = from_gguf_metadata(gguf_vocab(hf, kind, pre))
    for text in TEXTS + CORPUS[:8]:
        want = hf.encode(text).ids
        assert rebuilt.encode(text).ids == want, text
        assert rebuilt.decode(want) == hf.decode(want)
        assert rebuilt.decode(want, skip_special_tokens=False) == hf.decode(
            want, skip_special_tokens=False
        )
    assert len(hf.encode(TEXTS[0]).ids) > 20  # the test text really is split into many pieces


def test_gguf_file_to_tokenizer(tiny_model: Any, tmp_path: Path) -> None:
    """The full path: vocabulary written into a GGUF model, imported, loaded for generation."""
    from llmir_core.frontends.gguf import import_gguf
    from llmir_core.runtime.tokenizer import load_tokenizer

    from .gguf_convert import model_state, write_gguf

    hf = byte_level_bpe()
    folder, model = tiny_model("llama")
    meta = gguf_vocab(hf, "gpt2")
    meta["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}"
    write_gguf(folder, model_state(model), tmp_path / "m.gguf", tokenizer=meta)
    module = import_gguf(tmp_path / "m.gguf", out_path=tmp_path / "m.llmir")
    tok = load_tokenizer(module)
    assert tok.encode(TEXTS[0]) == hf.encode(TEXTS[0]).ids
    assert tok.decode(hf.encode(TEXTS[1]).ids) == hf.decode(hf.encode(TEXTS[1]).ids)
    assert tok.bos_id == 0 and tok.eos_ids == (1,) and tok.chat_template == meta["chat_template"]


def test_hf_tokenizer_json(tiny_model: Any, tmp_path: Path) -> None:
    import shutil

    from llmir_core.frontends.hf import import_hf
    from llmir_core.runtime.tokenizer import load_tokenizer

    folder, _ = tiny_model("llama")
    d = tmp_path / "m"
    shutil.copytree(folder, d)
    hf = sentencepiece_bpe()
    hf.save(str(d / "tokenizer.json"))
    tok = load_tokenizer(import_hf(d))
    assert tok.encode(TEXTS[0]) == hf.encode(TEXTS[0]).ids
    module = import_hf(d)
    (d / "tokenizer.json").unlink()  # the folder changed after the import
    with pytest.raises(InputError, match=r"tokenizer\.json: tokenizer file not found"):
        load_tokenizer(module)


def test_no_tokenizer_and_unknown_pre(tiny_model: Any, tmp_path: Path) -> None:
    from llmir_core.frontends.gguf import import_gguf
    from llmir_core.runtime.tokenizer import load_tokenizer

    from .gguf_convert import model_state, write_gguf

    folder, model = tiny_model("llama")
    write_gguf(folder, model_state(model), tmp_path / "a.gguf", tokenizer=False)
    with pytest.raises(
        InputError, match=r"a\.gguf: metadata field 'tokenizer\.ggml\.model' is missing"
    ):
        import_gguf(tmp_path / "a.gguf")
    module = import_gguf(tmp_path / "a.gguf", require_tokenizer=False)
    with pytest.raises(InputError, match=r"names no tokenizer \(attribute llm\.tokenizer\)"):
        load_tokenizer(module)
    meta = gguf_vocab(byte_level_bpe(), "gpt2")
    meta["pre"] = "no-such-pre"
    write_gguf(folder, model_state(model), tmp_path / "b.gguf", tokenizer=meta)
    with pytest.raises(
        InputError, match=r"b\.gguf: metadata field 'tokenizer\.ggml\.pre' is 'no-such-pre'"
    ):
        import_gguf(tmp_path / "b.gguf")
    # --no-tokenizer really drops it: the module names none, so the build takes token ids only
    module = import_gguf(tmp_path / "b.gguf", require_tokenizer=False)
    assert "llm.tokenizer" not in module.attrs and module.attrs["llm.eos_token_ids"] == (1,)
