"""llmir_core.serve.tool_grammar: the grammar of an "auto" tool choice, walked at random.

Each walk starts with a forced prefix (a call's opening in the format, or plain text) and then
takes uniformly random allowed tokens of the tiny character-level tokenizer until the grammar
ends it: what comes out must read (`ToolReader`) as calls whose arguments follow a strict tool's
schema, or as text with no call. Random tokens make anything else likely, so only the grammar
makes these hold.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from llmir_core.json_schema import validate
from llmir_core.runtime.grammar_spec import GrammarSpec
from llmir_core.runtime.tokenizer import Tokenizer
from llmir_core.serve.schemas import GenParams
from llmir_core.serve.tool_grammar import auto_grammar, hoisted, wanted
from llmir_core.serve.tool_parse import ToolReader
from tests.decoder.tiny import make_tokenizer

pytest.importorskip("llguidance", reason="llguidance is not installed")

from llmir_core.runtime.grammar import compile_grammar  # noqa: E402

EOS = 2
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "enum": [1, 3, 7]},
        "alerts": {"type": "boolean"},
    },
    "required": ["city", "days", "alerts"],
    "additionalProperties": False,
}
ADDRESS = {  # pydantic's shape: a nested model under $defs
    "$defs": {
        "Street": {
            "type": "object",
            "properties": {"no": {"type": "integer", "minimum": 1, "enum": [1, 5, 99]}},
            "required": ["no"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {"street": {"$ref": "#/$defs/Street"}},
    "required": ["street"],
    "additionalProperties": False,
}


def tool(name: str, params: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params, "strict": strict}}


TOOLS = [
    tool("get_weather", WEATHER),
    tool("mail", ADDRESS),
    tool("free", {"type": "object"}, False),
]
SCHEMAS = {"get_weather": WEATHER, "mail": ADDRESS}
OPENINGS = {
    "hermes": "<tool_call>",
    "llama3_json": " {",
    "mistral": "[TOOL_CALLS]",
    "mistral_args": "[TOOL_CALLS]",
}
FORMATS = list(OPENINGS)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(make_tokenizer(128), 1, (EOS,))


def params(**kw: Any) -> GenParams:
    kw.setdefault("tools", TOOLS)
    kw.setdefault("tool_choice", "auto")
    return GenParams(model="m", **kw)


def walk(tok: Tokenizer, spec: GrammarSpec, prefix: str, seed: int) -> str:
    """prefix, then random allowed tokens until the end (an error if prefix is refused)."""
    c = compile_grammar(spec, tok).constraint()
    rng = np.random.default_rng(seed)
    ids = tok.encode(prefix, add_special_tokens=False)
    for i in ids:
        assert c.allowed()[i], f"{prefix!r} refused at {tok.decode([i])!r}"
        c.accept(i)
    for _ in range(5000):
        t = int(rng.choice(np.flatnonzero(c.allowed())))
        if t == EOS:
            break
        c.accept(t)
        ids.append(t)
        if c.done:
            break
    else:
        raise AssertionError("the walk did not end")
    return tok.decode(ids)


def reader(fmt: str, p: GenParams) -> ToolReader:
    names = {t["function"]["name"] for t in p.tools or ()}
    return ToolReader(fmt, names, parallel=p.parallel_tool_calls)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("parallel", [True, False])
def test_a_started_call_follows_its_schema(tok: Tokenizer, fmt: str, parallel: bool) -> None:
    p = params(parallel_tool_calls=parallel)
    spec = auto_grammar(p, fmt, tok)  # type: ignore[arg-type]
    assert spec is not None
    lead = "Let me look. " if fmt != "llama3_json" else ""
    seen = set()
    for seed in range(8):
        text = walk(tok, spec, lead + OPENINGS[fmt], seed)
        content, calls = reader(fmt, p).read(text)
        assert calls, text
        assert len(calls) == 1 or parallel
        assert content == (lead.rstrip() or None)
        for c in calls:
            seen.add(c.name)
            args = json.loads(c.arguments)
            assert isinstance(args, dict)
            if c.name in SCHEMAS:
                assert validate(args, SCHEMAS[c.name]) == [], (c.name, args)
    assert seen & set(SCHEMAS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_text_stays_text(tok: Tokenizer, fmt: str) -> None:
    p = params()
    spec = auto_grammar(p, fmt, tok)  # type: ignore[arg-type]
    assert spec is not None
    for seed in range(4):
        text = walk(tok, spec, "Hi", seed)
        content, calls = reader(fmt, p).read(text)
        assert calls == [] and content == text


@pytest.mark.parametrize("fmt", FORMATS)
def test_with_response_format(tok: Tokenizer, fmt: str) -> None:
    """The answer is the response's JSON or calls; no text before a call."""
    answer = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    p = params(grammar=GrammarSpec("json_schema", answer, "response_format"))
    spec = auto_grammar(p, fmt, tok)  # type: ignore[arg-type]
    assert spec is not None
    text = walk(tok, spec, '{"ok', 0)
    assert json.loads(text) in ({"ok": True}, {"ok": False})
    opening = OPENINGS[fmt].strip() if fmt != "llama3_json" else '{"name'
    for seed in range(4):
        _, calls = reader(fmt, p).read(walk(tok, spec, opening, seed))
        assert calls
    if fmt == "hermes":
        c = compile_grammar(spec, tok).constraint()
        assert not c.allowed()[tok.encode("H", add_special_tokens=False)[0]]


def test_wanted_only_for_strict_or_a_response_format() -> None:
    assert not wanted(params(tools=[TOOLS[2]]))  # nothing strict: the model writes freely
    assert wanted(params(tools=[TOOLS[0]]))
    assert wanted(params(tools=[TOOLS[2]], grammar=GrammarSpec("json_object", None, "rf")))
    assert not wanted(params(tool_choice="none"))
    assert not wanted(params(tool_choice="required"))  # the forced grammar instead


def test_hoisted_definitions_resolve() -> None:
    placed, defs = hoisted(
        [WEATHER, ADDRESS, {"$ref": "#/$defs/A", "$defs": {"A": {"type": "integer"}}}]
    )
    assert placed[0] is WEATHER  # nothing to move
    assert placed[1]["properties"]["street"] == {"$ref": "#/$defs/t1.Street"}
    assert set(defs) == {"t1", "t1.Street", "t2", "t2.A"}
    root = {"$defs": defs, "type": "array", "prefixItems": placed}
    assert validate([{}, {"street": {"no": 5}}, 3][1], {**placed[1], "$defs": defs}) == []
    assert validate({"street": {"no": 0}}, {**placed[1], "$defs": defs}) != []
    assert validate(3, {**placed[2], "$defs": defs}) == []
    assert root["$defs"] is defs


@pytest.mark.parametrize(
    ("fmt", "tag"),
    [
        ("mistral", "[TOOL_CALLS]"),
        ("llama3_json", "<|python_tag|>"),
        ("mistral_args", "[TOOL_CALLS]"),
    ],
)
def test_a_special_tag_token(fmt: str, tag: str) -> None:
    """A tag the vocabulary has as one special token is that token in the grammar (its decoded
    text drops it: the calls follow)."""
    from tokenizers import AddedToken

    backend: Any = make_tokenizer(128)
    backend.add_special_tokens([AddedToken(tag, special=True)])
    tok = Tokenizer(backend, 1, (EOS,))
    tag_id = tok.token_to_id(tag)
    assert tag_id is not None
    p = params(parallel_tool_calls=False)
    spec = auto_grammar(p, fmt, tok)  # type: ignore[arg-type]
    assert spec is not None and f"<[{tag_id}]>" in spec.value
    c = compile_grammar(spec, tok).constraint()
    before = [] if fmt == "llama3_json" else tok.encode("Ok ", add_special_tokens=False)
    for i in [*before, tag_id]:
        assert c.allowed()[i]
        c.accept(i)
    assert not c.allowed()[tok.encode("x", add_special_tokens=False)[0]]  # a call must follow


@pytest.mark.parametrize("parallel", [True, False])
def test_required_with_nested_definitions(tok: Tokenizer, parallel: bool) -> None:
    """A forced "required" choice over tools whose schemas use `$defs` (pydantic's): the
    references resolve in the combined schema, and every call validates."""
    from llmir_core.serve.tool_parse import parse_forced
    from llmir_core.serve.tools import forced_schema

    p = params(tool_choice="required", parallel_tool_calls=parallel)
    schema = forced_schema(p)
    assert schema is not None and "t1.Street" in schema["$defs"]
    spec = GrammarSpec("json_schema", schema, "tool_choice")
    names = {t["function"]["name"] for t in TOOLS}
    mails = 0
    for seed in range(12):
        for c in parse_forced(walk(tok, spec, "", seed), names):
            if c.name in SCHEMAS:
                assert validate(json.loads(c.arguments), SCHEMAS[c.name]) == []
            mails += c.name == "mail"
    assert mails


def test_mistral_args_with_special_tags() -> None:
    """Both tags special tokens: the decoded answer drops them (`name{...}`), and what the
    grammar lets through still reads as valid calls."""
    from tokenizers import AddedToken

    backend: Any = make_tokenizer(128)
    backend.add_special_tokens([AddedToken("[TOOL_CALLS]", special=True)])
    backend.add_special_tokens([AddedToken("[ARGS]", special=True)])
    tok = Tokenizer(backend, 1, (EOS,))
    p = params()
    spec = auto_grammar(p, "mistral_args", tok)
    assert spec is not None
    tag = tok.token_to_id("[TOOL_CALLS]")
    assert tag is not None
    for seed in range(6):
        text = walk(tok, spec, "Ok [TOOL_CALLS]", seed)
        assert "[ARGS]" not in text and "[TOOL_CALLS]" not in text  # dropped by the decoding
        content, calls = reader("mistral_args", p).read(text)
        assert content == "Ok" and calls, text
        for c in calls:
            if c.name in SCHEMAS:
                assert validate(json.loads(c.arguments), SCHEMAS[c.name]) == []
