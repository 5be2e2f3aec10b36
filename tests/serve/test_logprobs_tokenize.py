"""vLLM's tokenizer endpoints (lm-eval's `remote` tokenizer): the served model's tokenizer over
HTTP, equal to the Hugging Face tokenizer of the model's folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import import_or_skip

from .conftest import Running, start_server
from .test_bad_input import call, expect

TEXT = "Question: How many legs does a cat have?\nAnswer: four"


def test_tokenize_equals_the_hugging_face_tokenizer(served: Running, tiny_dir: Path) -> None:
    transformers = import_or_skip("transformers", "the test extra (transformers) is not installed")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    m = served.model
    for special in (False, True):
        body = json.dumps({"model": m.name, "prompt": TEXT, "add_special_tokens": special})
        status, _, data = call(served.url, "POST", "/tokenize", body)
        assert status == 200, data
        assert data["tokens"] == hf.encode(TEXT, add_special_tokens=special)
        assert data["count"] == len(data["tokens"]) and data["max_model_len"] == m.max_context
    # the default: the ids /v1/completions gives the same text
    status, _, data = call(served.url, "POST", "/tokenize", json.dumps({"prompt": TEXT}))
    assert data["tokens"] == m.encode_text(TEXT)
    status, _, back = call(
        served.url, "POST", "/detokenize", json.dumps({"tokens": [1, *data["tokens"]]})
    )
    assert status == 200 and back["prompt"] == hf.decode([1, *data["tokens"]])
    status, _, info = call(served.url, "GET", "/tokenizer_info")
    assert status == 200
    assert info["eos_token"] == hf.eos_token == "<|im_end|>"
    assert info["bos_token"] == hf.bos_token == "<|im_start|>"
    assert info["chat_template"] == m.tokenizer.chat_template and info["chat_template"]
    assert info["model_max_length"] == m.max_context


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "param"),
    [
        ("/tokenize", {}, 400, "missing_required_parameter", "prompt"),
        ("/tokenize", {"prompt": 3}, 400, "invalid_type", "prompt"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": 1}, 400, "invalid_type", None),
        ("/tokenize", {"prompt": "x", "messages": []}, 400, "unsupported_parameter", "prompt"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model_not_found", "model"),
        ("/detokenize", {"tokens": "x"}, 400, "invalid_type", "tokens"),
        ("/detokenize", {"tokens": [5, 100000]}, 400, "invalid_value", "tokens"),
    ],
)
def test_tokenizer_endpoint_errors(
    served: Running,
    path: str,
    body: dict[str, object],
    status: int,
    code: str,
    param: str | None,
) -> None:
    got, _, data = call(served.url, "POST", path, json.dumps(body))
    expect(got, data, status, code, param)
    got, _, data = call(served.url, "POST", path, b"{not json")
    expect(got, data, 400, "invalid_json")


def test_tokenizer_endpoints_need_the_api_key(tiny_artifact: Path) -> None:
    srv = start_server(tiny_artifact, api_key="k3y", max_batch=1)
    try:
        got, _, data = call(srv.url, "POST", "/tokenize", json.dumps({"prompt": "hi"}))
        expect(got, data, 401, "invalid_api_key")
        got, _, data = call(srv.url, "GET", "/tokenizer_info")
        expect(got, data, 401, "invalid_api_key")
        got, _, data = call(
            srv.url,
            "POST",
            "/tokenize",
            json.dumps({"prompt": "hi"}),
            {"Authorization": "Bearer k3y"},
        )
        assert got == 200 and data["tokens"] == srv.model.encode_text("hi")
    finally:
        srv.stop()


def test_connections_send_without_delay() -> None:
    """lm-eval (requests) keeps its connection alive: without TCP_NODELAY every request after
    the first waited ~40 ms for the client's delayed ACK (tokenizing 14 requests took 1.3 s)."""
    import socket

    from llmir_core.serve.server import bind

    sock = bind("127.0.0.1", 0)
    client = socket.create_connection(sock.getsockname())
    conn, _ = sock.accept()
    try:
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for s in (conn, client, sock):
            s.close()


def test_tokenize_adds_special_tokens_only_when_asked() -> None:
    """With a tokenizer that puts a BOS in front (the tiny one adds none)."""
    from types import SimpleNamespace

    from tokenizers import processors

    from llmir_core.runtime.tokenizer import Tokenizer
    from llmir_core.serve.tokenize import tokenize
    from tests.decoder.tiny import make_tokenizer

    backend: Any = make_tokenizer(128)
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)]
    )
    model = SimpleNamespace(name="m", max_context=64, tokenizer=Tokenizer(backend, 1, (2,)))
    plain = backend.encode("hi", add_special_tokens=False).ids
    for body, want in (
        ({"prompt": "hi"}, [1, *plain]),
        ({"prompt": "hi", "add_special_tokens": True}, [1, *plain]),
        ({"prompt": "hi", "add_special_tokens": False}, plain),
    ):
        got = tokenize(model, json.dumps(body).encode())  # type: ignore[arg-type]
        assert got == {"count": len(want), "max_model_len": 64, "tokens": want}
