"""Request fields honored before issue 28 that no other test showed on their own: max_tokens and
max_completion_tokens, top_p and stop on chat, stream_options, and the informational fields
(user, safety_identifier, prompt_cache_key, metadata) that change nothing. Through the openai SDK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import Running
from .test_openai_api import client, run_text

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")

MESSAGES = [{"role": "user", "content": "Tell me a story"}]


def test_max_tokens(served: Running, tiny_artifact: Path) -> None:
    c, name = client(served), served.model.name
    got = c.completions.create(model=name, prompt="abc", max_tokens=3, temperature=0)
    assert got.usage is not None and got.usage.completion_tokens == 3
    assert got.choices[0].finish_reason == "length"
    assert got.choices[0].text == run_text(tiny_artifact, "abc", max_new_tokens=3)
    want = run_text(tiny_artifact, MESSAGES, max_new_tokens=4, chat=True)
    for fields in (
        {"max_tokens": 4},
        {"max_completion_tokens": 4},
        {"max_tokens": 9, "max_completion_tokens": 4},
    ):
        chat = c.chat.completions.create(model=name, messages=MESSAGES, temperature=0, **fields)
        assert chat.usage is not None and chat.usage.completion_tokens == 4, fields
        assert chat.choices[0].message.content == want


def test_chat_top_p_and_stop(served: Running, tiny_artifact: Path) -> None:
    c, name = client(served), served.model.name
    sampling: dict[str, Any] = {"temperature": 0.9, "top_p": 0.7, "seed": 5}
    want = run_text(tiny_artifact, MESSAGES, max_new_tokens=12, chat=True, **sampling)
    got = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12, **sampling)
    assert got.choices[0].message.content == want
    other = run_text(tiny_artifact, MESSAGES, max_new_tokens=12, chat=True, temperature=0.9, seed=5)
    assert other != want  # top_p changed the text: the comparison above says something
    full = run_text(tiny_artifact, MESSAGES, max_new_tokens=12, chat=True)
    stop = full[4:6]
    got = c.chat.completions.create(
        model=name, messages=MESSAGES, max_tokens=12, temperature=0, stop=[stop]
    )
    assert got.choices[0].message.content == full[: full.index(stop)]
    assert got.choices[0].finish_reason == "stop"


def test_stream_options(served: Running) -> None:
    c, name = client(served), served.model.name
    chunks = list(
        c.completions.create(
            model=name,
            prompt="abc",
            max_tokens=3,
            temperature=0,  # sampled, an EOS could end it early
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": False},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    for endpoint, fields, param in (
        ("completions", {"stream_options": {"include_usage": True}}, "stream_options"),
        ("chat", {"stream": True, "stream_options": {"usage": True}}, "stream_options"),
        ("chat", {"stream": True, "stream_options": {"include_usage": 1}}, "stream_options"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            if endpoint == "chat":
                c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2, **fields)
            else:
                c.completions.create(model=name, prompt="abc", max_tokens=2, **fields)
        assert err.value.param == param, fields


def test_informational_fields_change_nothing(served: Running) -> None:
    c, name = client(served), served.model.name
    base: dict[str, Any] = {"model": name, "max_tokens": 6, "temperature": 0.8, "seed": 2}
    plain = c.chat.completions.create(messages=MESSAGES, **base).choices[0].message.content
    info = {
        "user": "u-1",
        "safety_identifier": "h-5f3a",
        "prompt_cache_key": "k",
        "metadata": {"team": "a"},
        "store": False,
    }
    tagged = c.chat.completions.create(messages=MESSAGES, **base, **info)
    assert tagged.choices[0].message.content == plain
    text = c.completions.create(prompt="abc", **base).choices[0].text
    assert c.completions.create(prompt="abc", user="u-1", **base).choices[0].text == text
    for bad in ({"user": 5}, {"metadata": {"k": 1}}, {"metadata": ["a"]}):
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(messages=MESSAGES, **base, **bad)
        assert err.value.param == next(iter(bad)) and err.value.code == "invalid_type"
