"""Parser fuzzing: random and mutated text never crashes the parser, verifier or printer.

For any input, parse_module either raises ParseError (with a position inside the text) or
returns a module; a returned module verifies without raising and prints to text that parses to
an equal module. The one-line fast path and the token parser agree on every input. Inputs:
random strings, random strings over the format's own characters, and valid files (the golden
FileCheck files) with tokens deleted, inserted, duplicated, swapped or replaced, and characters
flipped.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from llmir_core.errors import ParseError
from llmir_core.ir.parser import Parser, parse_module
from llmir_core.ir.printer import print_module
from llmir_core.verifier import verify

FILECHECK = Path(__file__).resolve().parents[1] / "filecheck"
PROFILE = settings(max_examples=200, deadline=None, derandomize=True, database=None)
# tokens and the whitespace after them (a looser split than the parser's: fine for mutation)
_PIECE = re.compile(
    r'(tensor<[^<>]*(?:<[^<>]*>[^<>]*)*>|"(?:[^"\\\n]|\\.)*"|[%@?!]?[\w.$]+|->|.)(\s*)', re.S
)
ALPHABET = '%@?!{}[]()<>,:=+-*/"\\ \n\r\tx0123456789.abcdefilmnorstuvqkgw_é\x0c'


@lru_cache(maxsize=1)
def corpus() -> tuple[str, ...]:
    """The cases of the FileCheck files that parse, without their comment lines."""
    texts = []
    for p in sorted(FILECHECK.rglob("*.llmir")):
        for case in re.split(r"(?m)^// -----$", p.read_text(encoding="utf-8")):
            # drop the check comments: mutations of the IR are what matter
            text = "\n".join(line for line in case.split("\n") if not line.strip().startswith("//"))
            try:
                parse_module(text)
            except ParseError:
                continue
            texts.append(text)
    return tuple(texts)


@cache
def pieces(i: int) -> tuple[tuple[str, str], ...]:
    return tuple((m.group(1), m.group(2)) for m in _PIECE.finditer(corpus()[i]))


def check_input(text: str) -> None:
    outcomes = []
    for fast in (True, False):
        try:
            outcomes.append(Parser(text, "fuzz.llmir", fast=fast).parse_module())
        except ParseError as exc:
            lines = text.split("\n")
            assert 1 <= exc.pos.line <= len(lines), exc.message
            assert 1 <= exc.pos.col <= len(lines[exc.pos.line - 1]) + 1, exc.message
            outcomes.append(exc.message)
    fast_result, token_result = outcomes
    if isinstance(fast_result, str) or isinstance(token_result, str):
        assert fast_result == token_result
        return
    assert fast_result == token_result
    verify(fast_result, check_files=False)  # must not raise, whatever it reports
    printed = print_module(fast_result)
    again = parse_module(printed)
    assert again == fast_result
    assert print_module(again) == printed


@st.composite
def mutants(draw: st.DrawFn) -> str:
    i = draw(st.integers(0, len(corpus()) - 1))
    toks = list(pieces(i))
    pool = [t for t, _ in toks]
    for _ in range(draw(st.integers(1, 3))):
        if not toks:
            break
        k = draw(st.integers(0, len(toks) - 1))
        how = draw(st.sampled_from(["delete", "insert", "duplicate", "swap", "replace", "char"]))
        tok, ws = toks[k]
        if how == "delete":
            del toks[k]
        elif how == "insert":
            toks.insert(k, (draw(st.sampled_from(pool)), draw(st.sampled_from(["", " ", "\n"]))))
        elif how == "duplicate":
            toks.insert(k, (tok, ws or " "))
        elif how == "swap" and k + 1 < len(toks):
            toks[k], toks[k + 1] = (toks[k + 1][0], ws), (tok, toks[k + 1][1])
        elif how == "replace":
            toks[k] = (draw(st.sampled_from(pool)), ws)
        elif tok:
            j = draw(st.integers(0, len(tok)))
            ch = draw(st.sampled_from(ALPHABET))
            toks[k] = (
                tok[:j] + ch + tok[j + 1 :] if draw(st.booleans()) else tok[:j] + ch + tok[j:],
                ws,
            )
    return "".join(t + w for t, w in toks)


@PROFILE
@given(st.text(max_size=200))
def test_random_text(text: str) -> None:
    check_input(text)


@PROFILE
@given(st.text(st.sampled_from(ALPHABET), max_size=300))
def test_random_syntax_characters(text: str) -> None:
    check_input("module @m {\n  func.func @f(" + text)
    check_input(text)


@PROFILE
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    check_input(data.decode("latin-1"))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(mutants())
def test_mutated_valid_files(text: str) -> None:
    check_input(text)


def test_corpus() -> None:
    assert len(corpus()) >= 7  # the op goldens, the syntax file, the diagnostics that parse
    for text in corpus():
        check_input(text)
