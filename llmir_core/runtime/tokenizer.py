"""Tokenizers for imported models, on the `tokenizers` library.

A module imported from a Hugging Face folder names its `tokenizer.json`; one imported from GGUF
names the GGUF file, whose `tokenizer.ggml.*` metadata is rebuilt here into an equivalent
`tokenizers.Tokenizer`:

- `gpt2` (byte-level BPE): the vocabulary and merges as stored, the pre-tokenizer that
  `tokenizer.ggml.pre` names (GPT-2, Llama 3, Qwen2 and SmolLM splitting rules), byte-level decoding;
- `llama` (SentencePiece BPE): merges regenerated from the piece scores as transformers does for
  SentencePiece models, byte fallback (`<0xNN>` pieces), the `▁` space marker and an optional
  leading-space prefix.

Control tokens become special added tokens, user-defined ones plain added tokens, and
`add_bos_token` / `add_eos_token` a template post-processor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmir_core.errors import InputError
from llmir_core.fileio import read_json
from llmir_core.interrupts import import_optional

from .gguf_tokenizers import BUILDERS
from .pretokenize import SUPPORTED_PRE, build_pre_tokenizer, pre_tokenizer, special_tokens

_UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 2, 3, 4, 5, 6
TOKENIZER_MODELS = ("llama", "gpt2", *BUILDERS)  # tokenizer.ggml.model values llmir rebuilds


@dataclass
class Tokenizer:
    """A `tokenizers.Tokenizer` with the model's special ids and chat template."""

    backend: Any  # tokenizers.Tokenizer
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))


def _tokenizers() -> Any:
    return import_optional(
        "tokenizers", "the `tokenizers` package is not installed", hint="pip install tokenizers"
    )


def from_hf_file(path: str) -> Any:
    """Load a tokenizer.json."""
    tk = _tokenizers()
    if not os.path.isfile(path):
        raise InputError(
            f"{path}: tokenizer file not found", hint="the model folder moved: import it again"
        )
    try:
        return tk.Tokenizer.from_file(path)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # its own Exception type, or a Rust panic (a BaseException)
        read_json(path)  # not JSON or not UTF-8: the error at file:line:col, not the library's
        said = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a valid tokenizer.json ({said})") from None


def _spm_merges(
    tokens: list[str], scores: list[float] | None, types: list[int] | None
) -> list[tuple[str, str]]:
    """SentencePiece BPE merges from piece scores (transformers' `generate_merges` rule):
    every split of a piece into two pieces, the higher-scoring result first, then by id."""
    vocab = {t: i for i, t in enumerate(tokens)}
    skip = {i for i, ty in enumerate(types or []) if ty in (_CONTROL, _BYTE, _UNUSED)}
    ranked = []
    for i, piece in enumerate(tokens):
        if i in skip or len(piece) < 2:
            continue
        score = float(scores[i]) if scores is not None else -float(i)
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            li, ri = vocab.get(left), vocab.get(right)
            if li is None or ri is None or li in skip or ri in skip:
                continue
            ranked.append((-score, i, li, ri, left, right))
    ranked.sort()
    return [(r[4], r[5]) for r in ranked]


def _post_processor(tk: Any, meta: dict[str, Any], tokens: list[str]) -> Any:
    """BOS / EOS / SEP around the text as llama.cpp adds them (its defaults when keys are absent)."""
    st = special_tokens(meta)
    before = [st.bos_id] if st.add_bos and st.bos_id is not None else []
    after = [
        i for i, on in ((st.eos_id, st.add_eos), (st.sep_id, st.add_sep)) if on and i is not None
    ]
    if not before and not after:
        return None

    def seq(body: str, type_id: int) -> str:
        return " ".join(
            [
                *(f"{tokens[i]}:{type_id}" for i in before),
                body,
                *(f"{tokens[i]}:{type_id}" for i in after),
            ]
        )

    specials = list(dict.fromkeys((tokens[i], i) for i in before + after))
    return tk.processors.TemplateProcessing(
        single=seq("$A:0", 0), pair=seq("$A:0", 0) + " " + seq("$B:1", 1), special_tokens=specials
    )


def _added_tokens(
    tk: Any, tokens: list[str], types: list[int] | None, byte_level: bool
) -> list[Any]:
    out = []
    for i, ty in enumerate(types or []):
        if ty in (_CONTROL, _UNKNOWN):  # as HF saves them: special, skipped when decoding
            out.append(tk.AddedToken(tokens[i], special=True, normalized=False))
        elif ty == _USER_DEFINED:
            out.append(tk.AddedToken(tokens[i], special=False, normalized=byte_level))
    return out


def _check_merges(where: str, vocab: dict[str, int], merges: Sequence[tuple[str, ...]]) -> None:
    """Each merge is two tokens of the vocabulary (the BPE model refuses anything else)."""
    for i, m in enumerate(merges):
        bad = next((p for p in m if p not in vocab), None)
        if len(m) != 2 or bad is not None:
            what = f"names token '{bad}', which is not in" if bad else "is not two tokens of"
            raise InputError(
                f"{where}: tokenizer.ggml.merges[{i}] '{' '.join(m)}' {what} tokenizer.ggml.tokens",
                hint="the file's tokenizer is inconsistent: convert it again, or import with "
                "--no-tokenizer",
            )


def from_gguf_metadata(meta: dict[str, Any]) -> Any:
    """Build a `tokenizers.Tokenizer` from GGUF `tokenizer.ggml.*` fields (see read_tokenizer)."""
    tk = _tokenizers()
    where = meta.get("path", "the GGUF file")
    model = meta.get("model")
    tokens = meta.get("tokens")
    if not tokens:
        raise InputError(
            f"{where}: metadata field 'tokenizer.ggml.tokens' is missing",
            hint="the file holds no tokenizer: convert it again with one",
        )
    tokens = [str(t) for t in tokens]
    types = [int(t) for t in meta["token_type"]] if meta.get("token_type") is not None else None
    if model == "gpt2":
        merges_raw = meta.get("merges") or []
        merges = [tuple(m.split(" ", 1)) for m in merges_raw]
        pre = pre_tokenizer(meta.get("pre"))
        if pre is None:
            raise InputError(
                f"{where}: metadata field 'tokenizer.ggml.pre' is '{meta.get('pre')}', a "
                "pre-tokenizer llmir does not know",
                hint=f"supported: {', '.join(SUPPORTED_PRE)}; or import with --no-tokenizer",
            )
        vocab = {t: i for i, t in enumerate(tokens)}
        _check_merges(where, vocab, merges)
        t = tk.Tokenizer(tk.models.BPE(vocab, merges, ignore_merges=pre.ignore_merges))
        t.pre_tokenizer = build_pre_tokenizer(tk, pre)
        if pre.nfc:
            t.normalizer = tk.normalizers.NFC()
        t.decoder = tk.decoders.ByteLevel()
    elif model == "llama":
        scores = [float(s) for s in meta["scores"]] if meta.get("scores") is not None else None
        vocab = {t: i for i, t in enumerate(tokens)}
        merges_raw = meta.get("merges")
        merges = (
            [tuple(m.split(" ", 1)) for m in merges_raw]
            if merges_raw
            else _spm_merges(tokens, scores, types)
        )
        _check_merges(where, vocab, merges)
        unk = meta.get("unknown_token_id")
        bpe = tk.models.BPE(
            vocab,
            merges,
            unk_token=tokens[int(unk)] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
        t = tk.Tokenizer(bpe)
        prefix = bool(meta.get("add_space_prefix", True))
        norm = [tk.normalizers.Prepend("▁")] if prefix else []
        t.normalizer = tk.normalizers.Sequence(norm + [tk.normalizers.Replace(" ", "▁")])
        dec = [tk.decoders.Replace("▁", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
        if prefix:
            dec.append(tk.decoders.Strip(" ", 1, 0))
        t.decoder = tk.decoders.Sequence(dec)
    elif model in BUILDERS:
        t = BUILDERS[model](tk, meta, tokens)
    else:
        raise InputError(
            f"{where}: metadata field 'tokenizer.ggml.model' is '{model}', which is not supported",
            hint=f"supported tokenizer models: {', '.join(TOKENIZER_MODELS)}",
        )
    added = _added_tokens(tk, tokens, types, byte_level=model == "gpt2")
    if added:
        t.add_tokens(added)
    post = _post_processor(tk, meta, tokens)
    if post is not None:
        t.post_processor = post
    return t


def load_tokenizer(module: Any, base_dir: str | None = None) -> Tokenizer:
    """The tokenizer an imported module names in its `llm.tokenizer` attribute."""
    spec = module.attrs.get("llm.tokenizer")
    if not isinstance(spec, dict) or "file" not in spec:
        raise InputError(
            f"module @{module.name} names no tokenizer (attribute llm.tokenizer)",
            hint="import the model again with its tokenizer (tokenizer.json, or a GGUF "
            "file that holds one)",
        )
    if base_dir is None:
        base_dir = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
    path = (
        spec["file"]
        if os.path.isabs(spec["file"])
        else os.path.normpath(os.path.join(base_dir, spec["file"]))
    )
    fmt = spec.get("format")
    if fmt == "hf":
        backend = from_hf_file(path)
    elif fmt == "gguf":
        from llmir_core.frontends.gguf import read_tokenizer

        backend = from_gguf_metadata(read_tokenizer(path))
    else:
        raise InputError(
            f"module @{module.name}: llm.tokenizer format '{fmt}' is not known (hf, gguf)"
        )
    return Tokenizer(
        backend,
        module.attrs.get("llm.bos_token_id"),
        tuple(module.attrs.get("llm.eos_token_ids") or ()),
        module.attrs.get("llm.chat_template"),
    )


__all__ = [
    "Tokenizer",
    "load_tokenizer",
    "from_gguf_metadata",
    "from_hf_file",
    "SUPPORTED_PRE",
    "TOKENIZER_MODELS",
]
