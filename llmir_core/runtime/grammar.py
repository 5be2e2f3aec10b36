"""Grammar-constrained decoding: a `GrammarSpec` becomes a per-sequence token mask (llguidance).

`compile_grammar(spec, tokenizer)` checks and compiles the spec (a JSON Schema, any JSON
object, a Lark grammar in llguidance's dialect, a llama.cpp GBNF grammar or a regex) against a
tokenizer; `Grammar.constraint()` starts one sequence's `Constraint`:

- `allowed()` is the next token's mask (bool per vocabulary id), `apply(logits)` a copy of the
  logits with the other ids at -inf; an end-of-sequence id is allowed exactly when the output so
  far is a complete sentence of the grammar;
- `accept(token)` advances it; `done` is true once nothing but the end can follow,
  `accepting` once the output so far is complete.

`prefetch(constraints)` computes the next masks on a worker thread (llguidance drops the GIL
while it computes one), so a caller overlaps them with the model's forward: the serve scheduler
starts it before each step's forward and `apply` waits for it.

The tokenizer side (every token's bytes, llguidance's token trie) is built once per tokenizer
and cached: 2 to 7 s on Gemma 3's 262144 tokens on the shared 2-core machine, 3 ms on a
128-token one (benchmarks/grammar_mask.py, grammar_decode.py). Token bytes come from the
`tokenizers` vocabulary as llmir decodes it: byte-level BPE through the GPT-2 byte table,
SentencePiece pieces with `▁` as a space and `<0xNN>` byte-fallback pieces as their byte,
special tokens as special (never text); on Gemma 3 they equal llguidance's own reading of the
tokenizer.json for every id (tests/realmodel/test_structured.py).

JSON Schema: what llguidance does not implement is refused (its `lenient` mode, which drops
unknown keywords, stays off), so a schema is enforced whole or not at all. JSON is written
compactly with `", "` and `": "` separators (no free whitespace: a model cannot pad forever).

Why llguidance and not xgrammar (benchmarks/grammar_mask.py, the same token bytes of Gemma 3's
vocabulary and six schemas given to both): llguidance is a 3 MB wheel with no dependencies,
xgrammar needs torch, transformers, triton and pydantic (its import alone takes seconds, for
torch); llguidance compiles a schema about 50-100x faster (about 1 ms against 40-80 ms), and a
server compiles one per request with a new schema, before its first token. xgrammar's masks are
faster (it precomputes per-state token sets while compiling: about 15 us against 100-250 us
mean on Gemma, p99 0.1 ms against 1-5 ms), but a mask is computed beside the model's forward
(`prefetch`), which takes tens of milliseconds on CPU for even a 270M model, so llguidance's
mask time is off the critical path; xgrammar's compile time is not. See docs/serve.md.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.errors import InputError

from .grammar_spec import JSON_OPTIONS, GrammarSpec
from .textstream import byte_of_char
from .tokenizer import Tokenizer

# JSON output style: compact, one space after ',' and ':' (json.dumps' default)
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class GrammarError(InputError):
    """A schema or grammar that cannot be compiled; the message names where it came from."""


def _decoder_kinds(backend: Any) -> set[str]:
    dec = getattr(backend, "decoder", None)
    if dec is None:
        return set()
    state = json.loads(dec.__getstate__())
    parts = [state, *(state.get("decoders") or ())]
    kinds = {str(d.get("type")) for d in parts if isinstance(d, dict)}
    if any(
        d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == "▁"
        for d in parts
        if isinstance(d, dict)
    ):
        kinds.add("Metaspace")
    return kinds


def token_bytes(tokenizer: Tokenizer, vocab: int) -> tuple[list[bytes], list[int]]:
    """Every id's bytes as the text decodes them (ids past the vocabulary, and a lone 0xFF byte:
    b""), and the ids of special tokens (added tokens not marked special are text)."""
    backend = tokenizer.backend
    kinds = _decoder_kinds(backend)
    table = byte_of_char() if "ByteLevel" in kinds else None
    added = backend.get_added_tokens_decoder()
    special = sorted(i for i, t in added.items() if t.special and i < vocab)
    out = [b""] * vocab
    for piece, i in backend.get_vocab(with_added_tokens=True).items():
        if i >= vocab:
            continue
        if table is not None and all(c in table for c in piece):
            out[i] = bytes(table[c] for c in piece)
        elif i in added or table is not None:
            out[i] = piece.encode("utf-8", "surrogatepass")
        elif "ByteFallback" in kinds and _BYTE_PIECE.fullmatch(piece):
            out[i] = bytes([int(piece[3:5], 16)])
        else:
            text = piece.replace("▁", " ") if "Metaspace" in kinds else piece
            out[i] = text.encode("utf-8", "surrogatepass")
        if out[i][:1] == b"\xff":  # llguidance's mark of a special token; never in UTF-8 text
            out[i] = b""
    return out, special


class _Wrapped:
    """What llguidance's `TokenizerWrapper` reads: token bytes, special ids, an encoder."""

    def __init__(self, tokenizer: Tokenizer, vocab: int, eos: int) -> None:
        self.tokens, self.special_token_ids = token_bytes(tokenizer, vocab)
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        self._tok = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tok.encode(text, add_special_tokens=False)


@dataclass
class TokenIndex:
    """llguidance's view of one tokenizer (built once; `build_s` seconds)."""

    lltok: Any  # llguidance.LLTokenizer
    vocab: int
    eos_ids: tuple[int, ...]
    build_s: float


_INDEX: dict[tuple[int, int, tuple[int, ...]], tuple[Tokenizer, TokenIndex]] = {}
_INDEX_LOCK = threading.Lock()


def token_index(
    tokenizer: Tokenizer, vocab: int | None = None, eos_ids: Iterable[int] = ()
) -> TokenIndex:
    """The cached index of tokenizer over `vocab` ids (default: its vocabulary; a model's
    logits may be wider) with these end-of-sequence ids (default: the tokenizer's)."""
    import llguidance

    n = max(vocab or 0, tokenizer.vocab_size)
    eos = tuple(eos_ids) or tuple(tokenizer.eos_ids)
    key = (id(tokenizer), n, eos)
    with _INDEX_LOCK:
        hit = _INDEX.get(key)
        if hit is not None:
            return hit[1]
        t0 = time.perf_counter()
        wrapped = llguidance.TokenizerWrapper(_Wrapped(tokenizer, n, eos[0] if eos else -1))
        lltok = llguidance.LLTokenizer(wrapped, n_vocab=n, eos_token=list(eos) or None)
        index = TokenIndex(lltok, n, eos, time.perf_counter() - t0)
        _INDEX[key] = (tokenizer, index)  # the tokenizer stays alive, so its id stays unique
        return index


def _grammar_text(spec: GrammarSpec) -> str:
    """llguidance's grammar for spec (syntax errors surface when it is validated)."""
    from llguidance import LLMatcher

    if spec.kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
    if spec.kind == "json_schema":
        if not isinstance(spec.value, dict):
            raise GrammarError(f"{spec.source}: a JSON Schema must be a JSON object")
        try:
            return LLMatcher.grammar_from_json_schema(spec.value, overrides=JSON_OPTIONS)
        except ValueError as exc:
            raise GrammarError(f"{spec.source}: not a valid JSON Schema ({exc})") from None
    if not isinstance(spec.value, str):
        raise GrammarError(f"{spec.source}: the {spec.kind} must be text")
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.value)
    if spec.kind == "lark":
        return LLMatcher.grammar_from_lark(spec.value)
    raise GrammarError(f"{spec.source}: unknown grammar kind '{spec.kind}'")


def gbnf_to_lark(text: str, source: str) -> str:
    """A llama.cpp GBNF grammar in llguidance's Lark dialect (llguidance's converter)."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return str(any_to_lark(text))
    except Exception as exc:  # the converter raises plain Exceptions on bad input
        raise GrammarError(f"{source}: not a valid GBNF grammar ({_one_line(exc)})") from None


def read_grammar_file(path: str, kind: str) -> GrammarSpec:
    """`llmir run --json-schema FILE` (kind json_schema) or `--grammar FILE` (kind grammar: a
    Lark grammar, or llama.cpp GBNF for a .gbnf file) as a GrammarSpec naming the file."""
    import os

    from llmir_core.fileio import read_json, read_text

    if not os.path.isfile(path):
        raise GrammarError(f"{path}: no such file")
    if kind == "json_schema":
        schema = read_json(path)
        if not isinstance(schema, dict):
            raise GrammarError(f"{path}: a JSON Schema must be a JSON object")
        return GrammarSpec("json_schema", schema, path)
    text = read_text(path)
    if path.endswith(".gbnf"):
        text = gbnf_to_lark(text, path)
    return GrammarSpec("lark", text, path)


def grammar_option(json_schema: Any, grammar: Any) -> GrammarSpec | None:
    """`llmir run --json-schema FILE` / `--grammar FILE` (at most one) as a GrammarSpec."""
    if json_schema is not None and grammar is not None:
        raise GrammarError("--json-schema and --grammar both constrain the output: give one")
    if json_schema is not None:
        return read_grammar_file(str(json_schema), "json_schema")
    if grammar is not None:
        return read_grammar_file(str(grammar), "grammar")
    return None


def _one_line(msg: object, limit: int = 300) -> str:
    text = " ".join(str(msg).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Grammar:
    """A checked grammar compiled for one tokenizer: start sequences with `constraint()`."""

    spec: GrammarSpec
    index: TokenIndex
    text: str  # llguidance's grammar
    compile_s: float

    def constraint(self) -> Constraint:
        return Constraint(self)


def compile_grammar(
    spec: GrammarSpec,
    tokenizer: Tokenizer,
    *,
    vocab: int | None = None,
    eos_ids: Iterable[int] = (),
) -> Grammar:
    """Check and compile spec for tokenizer (GrammarError, one line naming `spec.source`)."""
    from llguidance import LLMatcher

    index = token_index(tokenizer, vocab, eos_ids)
    text = _grammar_text(spec)
    t0 = time.perf_counter()
    is_error, messages = LLMatcher.validate_grammar_with_warnings(text, index.lltok)
    if is_error:
        said = _one_line(messages[0])
        if spec.kind in ("json_schema", "json_object"):
            raise GrammarError(f"{spec.source}: this JSON Schema cannot be enforced: {said}")
        what = "Lark grammar" if spec.kind == "lark" else "regex"
        raise GrammarError(f"{spec.source}: this {what} is not valid: {said}")
    return Grammar(spec, index, text, time.perf_counter() - t0)


_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmir-grammar")


class Constraint:
    """One sequence's place in a grammar (see the module docstring)."""

    def __init__(self, grammar: Grammar) -> None:
        from llguidance import LLMatcher

        self.grammar = grammar
        self.vocab = grammar.index.vocab
        self.matcher = LLMatcher(grammar.index.lltok, grammar.text, log_level=0)
        self._check()
        self._bits = np.zeros((self.vocab + 31) // 32, dtype=np.int32)
        self._ids: tuple[bool, np.ndarray] | None = None  # the next mask's ids (see compute)
        self._pending: Future[None] | None = None

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"{self.grammar.spec.source}: {_one_line(self.matcher.get_error())}")

    def compute(self) -> None:
        """Compute the next token's mask (any thread; llguidance drops the GIL meanwhile), and
        the ids `apply` writes: the allowed ones when they are fewer, else the others."""
        if self._ids is not None:
            return
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._check()
        words = self._bits  # 32 ids a word: expand only the words that are not all one way
        some = np.flatnonzero(words != 0)  # words with an allowed id
        not_all = np.flatnonzero(words != -1)  # words with a blocked id
        keep = some.size <= not_all.size
        sel = some if keep else not_all
        picked = words[sel] if keep else ~words[sel]
        row, bit = np.nonzero(
            np.unpackbits(picked.view(np.uint8), bitorder="little").reshape(-1, 32)
        )
        ids = sel[row] * 32 + bit
        self._ids = (keep, ids[ids < self.vocab])

    def _wait(self) -> tuple[bool, np.ndarray]:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        self.compute()
        assert self._ids is not None
        return self._ids

    def allowed(self) -> np.ndarray:
        """The next token's mask: True where the id may come next."""
        keep, ids = self._wait()
        mask = np.full(self.vocab, not keep)
        mask[ids] = keep
        return mask

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A copy of logits (1-D) with every id the grammar does not allow next at -inf (ids
        past the tokenizer's vocabulary decode to nothing: never allowed)."""
        keep, ids = self._wait()
        row = np.asarray(logits, dtype=np.float32)
        if ids.size and ids[-1] >= row.shape[-1]:  # a tokenizer wider than the logits
            ids = ids[ids < row.shape[-1]]
        if keep:  # few allowed (between JSON values): start from -inf
            out = np.full(row.shape, -np.inf, dtype=np.float32)
            out[ids] = row[ids]
        else:  # most allowed (inside a string): block the few others
            out = np.array(row, copy=True)
            out[ids] = -np.inf
            out[self.vocab :] = -np.inf
        return out

    def accept(self, token: int) -> None:
        """Advance by the token the sampler picked (it must have been allowed)."""
        self._wait()
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(
                f"{self.grammar.spec.source}: token {token} does not fit the grammar "
                f"({_one_line(self.matcher.get_error())})"
            )
        self._ids = None

    @property
    def done(self) -> bool:
        """Nothing but the end of the sequence can follow."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        """The output so far is a complete sentence of the grammar."""
        return bool(self.matcher.is_accepting())


def prefetch(constraints: Iterable[Constraint | None]) -> None:
    """Compute the next masks of these constraints on the worker thread; each one's `apply`
    waits for its own."""
    todo = [c for c in constraints if c is not None and c._ids is None and c._pending is None]
    if not todo:
        return

    def work() -> None:
        for c in todo:
            c.compute()

    fut = _POOL.submit(work)
    for c in todo:
        c._pending = fut


__all__ = [
    "Constraint",
    "Grammar",
    "GrammarError",
    "TokenIndex",
    "compile_grammar",
    "prefetch",
    "token_bytes",
    "token_index",
    "JSON_OPTIONS",
    "gbnf_to_lark",
    "grammar_option",
    "read_grammar_file",
]
