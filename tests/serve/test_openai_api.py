"""The server through the official `openai` client: answers equal `llmir run` with the same seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmir_core.runtime.textgen import TextGenerator, TextGenOptions

from .conftest import Running

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")


def client(served: Running, **kw: object) -> Any:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, **kw)  # type: ignore[arg-type]


def run_text(art: Path, prompt: object, **opts: object) -> str:
    """What `llmir run ART --prompt ... [--chat]` prints for the same request."""
    gen = TextGenerator(str(art), TextGenOptions(threads=1, **opts))  # type: ignore[arg-type]
    return gen.generate(prompt).result.text  # type: ignore[arg-type]


def test_models(served: Running) -> None:
    ids = [m.id for m in client(served).models.list()]
    assert ids == [served.model.name]


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.0}, {"temperature": 0.9, "top_p": 0.8, "seed": 7}]
)
def test_completion_equals_run(
    served: Running, tiny_artifact: Path, sampling: dict[str, float]
) -> None:
    c = client(served)
    got = c.completions.create(
        model=served.model.name, prompt="Once upon a time", max_tokens=12, **sampling
    )
    want = run_text(tiny_artifact, "Once upon a time", max_new_tokens=12, **sampling)
    assert got.choices[0].text == want
    assert got.usage is not None and got.usage.completion_tokens >= 1
    assert got.choices[0].finish_reason in ("length", "stop")
    # streamed: the same text, in pieces, the last chunk with usage
    stream = c.completions.create(
        model=served.model.name, prompt="Once upon a time", max_tokens=12, stream=True, **sampling
    )
    chunks = list(stream)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == got.usage.total_tokens


def test_chat_equals_run_chat(served: Running, tiny_artifact: Path) -> None:
    c = client(served)
    messages = [{"role": "user", "content": "Hi there"}]
    want = run_text(tiny_artifact, messages, max_new_tokens=10, chat=True, temperature=0.7, seed=3)
    got = c.chat.completions.create(
        model=served.model.name,
        messages=messages,
        max_tokens=10,  # type: ignore[arg-type]
        temperature=0.7,
        seed=3,
    )
    assert got.choices[0].message.content == want
    assert got.choices[0].message.role == "assistant"
    stream = c.chat.completions.create(
        model=served.model.name,
        messages=messages,
        max_tokens=10,  # type: ignore[arg-type]
        temperature=0.7,
        seed=3,
        stream=True,
    )
    pieces, usage = [], None
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            pieces.append(ch.choices[0].delta.content)
        usage = ch.usage or usage
    assert "".join(pieces) == want and len(pieces) > 1
    assert usage is not None and usage.completion_tokens == got.usage.completion_tokens  # type: ignore[union-attr]


def test_stop_string(served: Running, tiny_artifact: Path) -> None:
    full = run_text(tiny_artifact, "abc", max_new_tokens=12)
    stop = full[4:6]
    got = client(served).completions.create(
        model=served.model.name, prompt="abc", max_tokens=12, temperature=0, stop=[stop]
    )
    assert got.choices[0].text == full[: full.index(stop)]
    assert got.choices[0].finish_reason == "stop"
    want = run_text(tiny_artifact, "abc", max_new_tokens=12, stop=(stop,))
    assert want == got.choices[0].text  # as `llmir run --stop`
    chunks = list(
        client(served).completions.create(
            model=served.model.name,
            prompt="abc",
            max_tokens=12,
            temperature=0,
            stop=[stop],
            stream=True,
        )
    )
    assert (
        "".join(ch.choices[0].text for ch in chunks if ch.choices) == want
    )  # nothing past the stop leaks
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_openai_errors(served: Running) -> None:
    c = client(served)
    with pytest.raises(openai.NotFoundError) as nf:
        c.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as br:
        c.completions.create(model=served.model.name, prompt="x", max_tokens=2, temperature=3.0)
    assert br.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as ctx:
        c.completions.create(model=served.model.name, prompt="word " * 200, max_tokens=2)
    assert ctx.value.code == "context_length_exceeded"
