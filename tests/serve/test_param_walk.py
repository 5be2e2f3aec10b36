"""The field walk: every request field of the openai SDK's own parameter types for
`chat.completions.create` and `completions.create` is in `llmir_core.serve.params.PARAMS`;
each refused one, sent through the SDK with its sample value, is a 400 naming it; each honored
or no-op one names tests that exist; unknown fields are refused as OpenAI refuses them."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from llmir_core.serve.params import CHAT, COMPLETIONS, ENDPOINTS, EXTRAS, PARAMS, Param, table
from tests.conftest import REPO

from .conftest import Running

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")

MESSAGES = [{"role": "user", "content": "Hi"}]


def sdk_fields(endpoint: str) -> set[str]:
    """The request fields of the SDK's TypedDicts (annotations, required and optional keys)."""
    if endpoint == CHAT:
        from openai.types.chat import completion_create_params as mod
    else:
        from openai.types import completion_create_params as mod
    fields: set[str] = set()
    for typed in (mod.CompletionCreateParamsNonStreaming, mod.CompletionCreateParamsStreaming):
        fields |= set(typed.__required_keys__) | set(typed.__optional_keys__)
        for klass in typed.__mro__:
            fields |= set(getattr(klass, "__annotations__", {}))
    return fields


def client(served: Running) -> Any:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def create(served: Running, endpoint: str, **fields: Any) -> Any:
    """One request through the SDK's own method for the endpoint."""
    c, name = client(served), served.model.name
    if endpoint == CHAT:
        return c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2, **fields)
    return c.completions.create(model=name, prompt="Hi", max_tokens=2, **fields)


def _cases(status: str) -> list[Any]:
    return [
        pytest.param(e, p, id=f"{e}-{p.name}")
        for p in PARAMS
        if p.status == status or (status == "tested" and p.status != "refused")
        for e in p.endpoints
    ]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_sdk_field_is_in_the_table(endpoint: str) -> None:
    fields = sdk_fields(endpoint)
    assert {"model", "stream", "temperature"} <= fields  # the walk reads the SDK at all
    missing = sorted(fields - set(table(endpoint)))
    assert not missing, f"fields of the openai SDK missing from params.PARAMS: {missing}"
    # and the table lists nothing beyond the SDK's fields and the documented extras
    assert set(table(endpoint)) - fields <= set(EXTRAS)


def test_each_field_is_listed_once_per_endpoint() -> None:
    seen = [(e, p.name) for p in PARAMS for e in p.endpoints]
    assert len(seen) == len(set(seen))
    for p in PARAMS:
        if p.status == "refused":
            assert p.sample is not None and not p.tests, p.name
        else:
            assert p.tests and not p.off and p.sample is None, p.name


@pytest.mark.parametrize(("endpoint", "param"), _cases("refused"))
def test_refused_field_is_a_400_naming_it(served: Running, endpoint: str, param: Param) -> None:
    def send(value: Any, **kw: Any) -> Any:  # an extra is not in the SDK's signature
        field = {param.name: value}
        return create(served, endpoint, **({"extra_body": field} if param.extra else field), **kw)

    with pytest.raises(openai.BadRequestError) as err:
        send(param.sample)
    assert err.value.status_code == 400
    assert err.value.param == param.name
    assert err.value.code == "unsupported_parameter"
    assert param.meaning in err.value.message
    for off in param.off:  # the values that ask for nothing are accepted
        assert send(off, temperature=0).choices


@cache
def _test_functions(path: str) -> frozenset[str]:
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    )


@pytest.mark.parametrize(("endpoint", "param"), _cases("tested"))
def test_honored_field_names_tests_that_exist(endpoint: str, param: Param) -> None:
    for ref in param.tests:
        path, _, name = ref.partition("::")
        assert path.startswith("tests/") and name, ref
        assert Path(REPO / path).is_file(), f"{param.name}: {path} does not exist"
        assert name in _test_functions(path), f"{param.name}: {ref} does not exist"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("value", [1, None, "x"])
def test_unknown_field_is_refused(served: Running, endpoint: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        create(served, endpoint, extra_body={"frobnicate": value})
    assert err.value.param == "frobnicate"
    assert err.value.code == "unknown_parameter"
    assert err.value.body["message"] == "Unrecognized request argument supplied: frobnicate"


def test_fields_of_one_endpoint_are_unknown_on_the_other(served: Running) -> None:
    for endpoint, name, value in (
        (COMPLETIONS, "messages", MESSAGES),
        (COMPLETIONS, "max_completion_tokens", 2),
        (COMPLETIONS, "tools", [{"type": "function", "function": {"name": "f"}}]),
        (CHAT, "prompt", "Hi"),
        (CHAT, "suffix", "x"),
        (CHAT, "best_of", 2),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            create(served, endpoint, extra_body={name: value})
        assert err.value.param == name and err.value.code == "unknown_parameter", name
        other = "/v1/completions" if endpoint == CHAT else "/v1/chat/completions"
        assert err.value.body["message"].endswith(f"(it is a {other} parameter)")
