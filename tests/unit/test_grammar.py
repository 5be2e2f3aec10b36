"""llmir_core.runtime.grammar: token bytes, compile errors, the mask and its end-of-sequence rule,
on small tokenizers built here (no model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.runtime.grammar import (
    Constraint,
    GrammarError,
    compile_grammar,
    grammar_option,
    prefetch,
    token_bytes,
    token_index,
)
from llmir_core.runtime.grammar_spec import GrammarSpec
from llmir_core.runtime.tokenizer import Tokenizer, from_gguf_metadata
from tests.decoder.tiny import make_tokenizer

pytest.importorskip("llguidance", reason="llguidance is not installed")

EOS = 2  # <|im_end|> of the tiny tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(make_tokenizer(128), 1, (EOS,))


def spec(kind: str, value: Any) -> GrammarSpec:
    return GrammarSpec(kind, value, "where")  # type: ignore[arg-type]


def walk(c: Constraint, rng: np.random.Generator, limit: int = 400) -> list[int]:
    """A random path through the grammar: uniform over the allowed ids, until it ends."""
    out: list[int] = []
    for _ in range(limit):
        choices = np.flatnonzero(c.allowed())
        t = int(rng.choice(choices))
        if t == EOS:
            return out
        c.accept(t)
        out.append(t)
        if c.done:
            return out
    raise AssertionError("the walk did not end")


def test_token_bytes_char_level(tok: Tokenizer) -> None:
    toks, special = token_bytes(tok, 130)
    assert special == list(range(3)) + list(range(104, 128))  # ChatML specials and fillers
    assert toks[3] == b"\n" and toks[tok.token_to_id(" ") or 0] == b" "
    assert toks[tok.token_to_id("th") or 0] == b"th" and toks[128:] == [b"", b""]  # past it
    assert all(toks[i] == tok.decode([i]).encode() for i in range(3, 104))


def test_token_bytes_sentencepiece_and_byte_level() -> None:
    """`▁` is a space, `<0xNN>` its byte (SentencePiece, GGUF llama); GPT-2 byte characters."""
    meta = {
        "model": "llama",
        "tokens": ["<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "▁a", "b", "▁", "a"],
        "scores": [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0],
        "token_type": [2, 3, 3, 6, 6, 1, 1, 1, 1],
        "add_space_prefix": False,
    }
    spm = Tokenizer(from_gguf_metadata(meta), 1, (2,))
    toks, special = token_bytes(spm, 9)
    assert toks[3:] == [b"\n", b"\xc3", b" a", b"b", b" ", b"a"] and special == [0, 1, 2]
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models

    bl = HF(models.BPE({"Ġhi": 0, "Ċ": 1, "Ã©": 2, "x": 3}, []))
    bl.decoder = decoders.ByteLevel()
    toks, _ = token_bytes(Tokenizer(bl), 4)
    assert toks == [b" hi", b"\n", "é".encode(), b"x"]


def test_index_is_built_once(tok: Tokenizer) -> None:
    a = token_index(tok)
    assert token_index(tok) is a and a.vocab == 128 and a.eos_ids == (EOS,)
    assert token_index(tok, 160) is not a and token_index(tok, 160).vocab == 160


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        (
            "json_schema",
            {"type": "object", "if": {}},
            "where: this JSON Schema cannot be enforced: ",
        ),
        ("json_schema", {"type": "strin"}, "where: this JSON Schema cannot be enforced: "),
        ("json_schema", {"type": "string", "format": "nope"}, "cannot be enforced"),
        ("json_schema", [1], "where: a JSON Schema must be a JSON object"),
        ("lark", "start: (", "where: this Lark grammar is not valid: "),
        ("lark", 3, "where: the lark must be text"),
        ("regex", "a(", "where: this regex is not valid: "),
    ],
)
def test_bad_specs_are_one_line(tok: Tokenizer, kind: str, value: Any, message: str) -> None:
    with pytest.raises(GrammarError) as info:
        compile_grammar(spec(kind, value), tok)
    assert message in info.value.message and "\n" not in info.value.message


def test_eos_allowed_exactly_when_the_grammar_can_end(tok: Tokenizer) -> None:
    c = compile_grammar(spec("lark", 'start: "a"+ "b"?'), tok).constraint()
    a, b = tok.encode("a", False)[0], tok.encode("b", False)[0]
    assert set(np.flatnonzero(c.allowed())) == {a}  # not EOS: the text cannot end empty
    c.accept(a)
    assert set(np.flatnonzero(c.allowed())) == {a, b, EOS} and c.accepting and not c.done
    c.accept(b)
    assert set(np.flatnonzero(c.allowed())) == {EOS} and c.done
    with pytest.raises(GrammarError, match="does not fit the grammar"):
        compile_grammar(spec("lark", 'start: "a"'), tok).constraint().accept(b)


def test_apply_blocks_the_rest(tok: Tokenizer) -> None:
    """Both ways apply writes the mask: from -inf (few allowed) and blocking (most allowed)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(128).astype(np.float32)
    for grammar in ('start: "x" | "y"', "start: /[^x]+/"):
        c = compile_grammar(spec("lark", grammar), tok).constraint()
        allowed = c.allowed()
        out = c.apply(logits)
        assert np.all(out[allowed] == logits[allowed]) and np.all(np.isneginf(out[~allowed]))
        assert 0 < allowed.sum() and not np.isneginf(logits).any()
    wide = compile_grammar(spec("lark", "start: /[^x]+/"), tok, vocab=140).constraint()
    assert np.isneginf(wide.apply(np.zeros(140, np.float32))[128:]).all()  # past the tokenizer


def test_prefetch_gives_the_same_masks(tok: Tokenizer) -> None:
    g = compile_grammar(spec("json_object", None), tok)
    a, b = g.constraint(), g.constraint()
    for t in tok.encode('{"k": [1, 2]}', False):
        prefetch([a, None])
        assert np.array_equal(a.allowed(), b.allowed())
        a.accept(t)
        b.accept(t)
    assert a.done and b.done


SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": -3, "maximum": 3},
            "tags": {
                "type": "array",
                "items": {"enum": ["p", "q", 7]},
                "minItems": 1,
                "maxItems": 2,
            },
            "inner": {
                "type": "object",
                "properties": {"s": {"type": "string", "pattern": "^[a-c]{2,3}$"}},
                "required": ["s"],
                "additionalProperties": False,
            },
        },
        "required": ["id", "tags", "inner"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_random_walks_are_valid_json(tok: Tokenizer, schema: dict[str, Any]) -> None:
    g = compile_grammar(spec("json_schema", schema), tok)
    rng = np.random.default_rng(1)
    for _ in range(20):
        value = json.loads(tok.decode(walk(g.constraint(), rng)))
        if isinstance(value, dict):
            assert -3 <= value["id"] <= 3 and 1 <= len(value["tags"]) <= 2
            assert set(value["tags"]) <= {"p", "q", 7} and value["inner"]["s"] in {
                a + b + c for a in "abc" for b in "abc" for c in ("", "a", "b", "c")
            }
        else:
            assert len(value) <= 3 and all(isinstance(s, str) and len(s) <= 3 for s in value)


def test_json_is_compact_with_spaces(tok: Tokenizer) -> None:
    c = compile_grammar(spec("json_object", None), tok).constraint()
    allowed = np.flatnonzero(c.allowed())
    assert [tok.decode([int(t)]) for t in allowed] == ["{"]  # no leading whitespace
    for t in tok.encode('{"a": 1, "b": 2}', False):
        c.accept(t)
    assert c.done


def test_grammar_option_reads_files(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"type": "integer"}')
    (tmp_path / "g.gbnf").write_text('root ::= "a" [0-9]\n')
    (tmp_path / "g.lark").write_text('start: "a"\n')
    got = grammar_option(tmp_path / "s.json", None)
    assert got == GrammarSpec("json_schema", {"type": "integer"}, str(tmp_path / "s.json"))
    gbnf = grammar_option(None, tmp_path / "g.gbnf")
    assert gbnf is not None and gbnf.kind == "lark" and "root" not in gbnf.value.split(":")[0]
    assert grammar_option(None, tmp_path / "g.lark") == GrammarSpec(
        "lark", 'start: "a"\n', str(tmp_path / "g.lark")
    )
    assert grammar_option(None, None) is None
    with pytest.raises(GrammarError, match="give one"):
        grammar_option(tmp_path / "s.json", tmp_path / "g.lark")
