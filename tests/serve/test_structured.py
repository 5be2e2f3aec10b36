"""Structured outputs through the openai SDK: `response_format` json_object and json_schema.

The tiny artifact has random weights, so its outputs are JSON (and fit the schema) only because
the grammar's mask allows nothing else; every schema is bounded (enums, maxLength, maxItems,
integer bounds) so an output ends well within max_tokens, and a `length` finish fails the test.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from .conftest import Running

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")
pytest.importorskip("llguidance", reason="llguidance is not installed")

MAX_TOKENS = 160
SEEDS = (0, 1, 2, 3)
STR = {"type": "string", "maxLength": 6}


def obj(props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


SUITE: dict[str, dict[str, Any]] = {
    "nested": obj(
        {
            "user": obj(
                {
                    "name": STR,
                    "address": obj(
                        {"city": STR, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}
                    ),
                }
            ),
            "active": {"type": "boolean"},
        }
    ),
    "enums": obj(
        {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", 1, None]}}
    ),
    "arrays": obj(
        {
            "tags": {"type": "array", "items": STR, "minItems": 1, "maxItems": 3},
            "pair": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 2,
                "maxItems": 2,
            },
        }
    ),
    "integers": obj(
        {
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "delta": {"type": "integer", "minimum": -5, "maximum": 5},
        }
    ),
    "strings": obj(
        {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
            "note": {"type": "string", "maxLength": 8},
        }
    ),
}


def violations(value: Any, schema: dict[str, Any], at: str = "$") -> list[str]:
    """Where value breaks schema (the keywords the suite uses; an unknown one fails loudly)."""
    known = {"type", "properties", "required", "additionalProperties", "enum", "items"}
    known |= {"minItems", "maxItems", "minimum", "maximum", "pattern", "maxLength"}
    assert set(schema) <= known, set(schema) - known
    out: list[str] = []
    types = {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "integer": int,
    }
    t = schema.get("type")
    if t is not None and (
        not isinstance(value, types[t]) or (t == "integer" and isinstance(value, bool))
    ):
        return [f"{at}: {value!r} is not {t}"]
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        out.append(f"{at}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{at}: misses {k}" for k in schema.get("required", ()) if k not in value]
        if schema.get("additionalProperties") is False:
            out += [f"{at}: extra key {k}" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                out += violations(v, props[k], f"{at}.{k}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            out.append(f"{at}: {len(value)} items")
        out += [
            e for i, v in enumerate(value) for e in violations(v, schema["items"], f"{at}[{i}]")
        ]
    if isinstance(value, int) and not isinstance(value, bool):
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            out.append(f"{at}: {value} out of bounds")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)):
            out.append(f"{at}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{at}: {value!r} does not match {schema['pattern']}")
    return out


def test_violations_finds_breaks() -> None:
    """The check the suite relies on catches each kind of break."""
    s = SUITE
    assert violations({"color": "red", "size": "M"}, s["enums"]) == []
    assert violations({"color": "pink", "size": "M"}, s["enums"])
    assert violations({"year": 1800, "delta": 0}, s["integers"])
    assert violations({"tags": [], "pair": [1, 2]}, s["arrays"])
    assert violations({"tags": ["a"], "pair": [1, 2, 3]}, s["arrays"])
    assert violations({"code": "AB-12", "word": "ab", "note": ""}, s["strings"])
    assert violations({"code": "ABC-12", "word": "abcdef", "note": ""}, s["strings"])
    assert violations({"user": {}, "active": True}, s["nested"])
    assert violations({"color": "red", "size": "M", "x": 1}, s["enums"])


def client(served: Running) -> Any:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def chat(
    served: Running, response_format: dict[str, Any], seed: int, max_tokens: int = MAX_TOKENS
) -> Any:
    return client(served).chat.completions.create(
        model=served.model.name,
        messages=[{"role": "user", "content": "Reply in JSON."}],
        response_format=response_format,  # type: ignore[arg-type]
        temperature=1.0,
        seed=seed,
        max_tokens=max_tokens,
    )


def json_schema(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def parsed(answer: Any) -> Any:
    choice = answer.choices[0]
    text = choice.message.content if hasattr(choice, "message") else choice.text
    assert choice.finish_reason == "stop", (choice.finish_reason, text)
    return json.loads(text)


def test_response_format_json_schema(served: Running) -> None:
    schema = SUITE["nested"]
    for seed in SEEDS:
        value = parsed(chat(served, json_schema("person", schema), seed))
        assert violations(value, schema) == [], value


def test_response_format_json_object(served: Running) -> None:
    """Any object: unbounded, so these seeds are ones whose random walk closes it within 220
    tokens (others run to the length limit: nothing bounds a free object's strings)."""
    sizes = []
    for seed in (0, 1, 2, 9):
        answer = chat(served, {"type": "json_object"}, seed, max_tokens=220)
        assert isinstance(parsed(answer), dict)
        sizes.append(len(answer.choices[0].message.content))
    assert min(sizes) == 2 and max(sizes) > 100  # `{}`, and long objects with keys


@pytest.mark.parametrize("name", sorted(SUITE))
def test_schema_suite(served: Running, name: str) -> None:
    """Every output of every seed parses and validates (100%, not most)."""
    schema = SUITE[name]
    for seed in (*SEEDS, 11, 12):
        value = parsed(chat(served, json_schema(name, schema), seed))
        assert violations(value, schema) == [], (seed, value)


def test_completions_take_response_format(served: Running) -> None:
    schema = SUITE["enums"]
    answer = client(served).completions.create(
        model=served.model.name,
        prompt="Colors:",
        max_tokens=MAX_TOKENS,
        seed=5,
        extra_body={"response_format": json_schema("colors", schema)},
    )
    assert violations(parsed(answer), schema) == []


def test_stream_equals_whole(served: Running) -> None:
    rf = json_schema("ints", SUITE["integers"])
    whole = chat(served, rf, 7).choices[0].message.content
    stream = client(served).chat.completions.create(
        model=served.model.name,
        messages=[{"role": "user", "content": "Reply in JSON."}],
        response_format=rf,  # type: ignore[arg-type]
        temperature=1.0,
        seed=7,
        max_tokens=MAX_TOKENS,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole and json.loads(text)


def test_text_is_free(served: Running) -> None:
    answer = chat(served, {"type": "text"}, 0)
    assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": {}}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a"}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "extra": 1}},
            "response_format.json_schema.extra",
        ),
        ({"type": "json_object", "schema": {}}, "response_format.schema"),
        # JSON Schema the library does not implement: refused, not dropped
        (
            json_schema("a", {"type": "object", "if": {"required": ["a"]}, "then": {}}),
            "response_format.json_schema.schema",
        ),
        (json_schema("a", {"type": "strin"}), "response_format.json_schema.schema"),
        (
            json_schema("a", {"type": "string", "pattern": "(unclosed"}),
            "response_format.json_schema.schema",
        ),
    ],
)
def test_bad_response_format(served: Running, response_format: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(served, response_format, 0)
    err = info.value.body
    assert info.value.status_code == 400
    assert err["param"] == param, err
    assert "\n" not in err["message"] and err["message"], err


def test_concurrent_mixed_requests(served: Running) -> None:
    """Constrained and free requests decode in one batch: each constrained one validates, each
    free one is the text it gets alone (the masks are per sequence)."""
    from concurrent.futures import ThreadPoolExecutor

    schema = SUITE["arrays"]
    alone = chat(served, {"type": "text"}, 21, max_tokens=24).choices[0].message.content
    jobs = [({"type": "text"}, 21, 24), *[(json_schema("a", schema), s, MAX_TOKENS) for s in SEEDS]]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda j: chat(served, j[0], j[1], j[2]), jobs))
    assert answers[0].choices[0].message.content == alone
    for a in answers[1:]:
        assert violations(parsed(a), schema) == []
