"""/tokenize and /detokenize in llama.cpp's body and vLLM's chat form, and /tokenizer_info as
lm-evaluation-harness's `RemoteTokenizer` reads it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmir_core.serve.tokenize import piece
from tests.conftest import import_or_skip

from .conftest import Running
from .test_bad_input import call, expect

TEXT = "Question: the cat?\nAnswer: four"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def post(served: Running, path: str, **body: Any) -> Any:
    """POST through the openai SDK's own client (its generic `post`; the tokenizer endpoints are
    not among its resources): a non-200 answer raises."""
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    return client.post(served.url + path, body=body, cast_to=object)


def test_llama_cpp_tokenize_and_detokenize(served: Running) -> None:
    tok = served.model.tokenizer
    plain = tok.encode(TEXT, add_special_tokens=False)
    assert post(served, "/tokenize", content=TEXT) == {"tokens": plain}  # add_special: false
    special = tok.encode(TEXT, add_special_tokens=True)
    assert post(served, "/tokenize", content=TEXT, add_special=True) == {"tokens": special}
    got = post(served, "/tokenize", content="<|im_start|>" + TEXT, with_pieces=True)["tokens"]
    assert [t["id"] for t in got] == tok.encode("<|im_start|>" + TEXT, add_special_tokens=False)
    assert got[0]["piece"] == "<|im_start|>"
    assert "".join(t["piece"] for t in got) == "<|im_start|>" + TEXT
    back = post(served, "/detokenize", tokens=[1, *plain])
    assert back == {"prompt": "<|im_start|>" + TEXT, "content": "<|im_start|>" + TEXT}


def test_piece_of_a_byte_token_is_its_bytes() -> None:
    """A SentencePiece byte-fallback token that is part of a character comes back as bytes."""
    texts = {5: "<0xC3>", 6: "\u2581the", 7: "<0x41>"}
    model: Any = SimpleNamespace(
        token_bytes=None, special_ids=frozenset(), token_text=lambda i: texts[i]
    )
    assert piece(model, 5) == [0xC3]
    assert piece(model, 6) == " the"
    assert piece(model, 7) == "A"


def test_vllm_chat_form_tokenizes_the_rendered_conversation(served: Running) -> None:
    m = served.model
    want = m.tokenizer.encode(m.render_chat(MESSAGES), add_special_tokens=False)
    got = post(served, "/tokenize", messages=MESSAGES)
    assert got == {"count": len(want), "max_model_len": m.max_context, "tokens": want}
    # the same ids /v1/chat/completions feeds the model
    body = json.dumps({"model": m.name, "messages": MESSAGES, "max_tokens": 1})
    status, _, chat = call(served.url, "POST", "/v1/chat/completions", body)
    assert status == 200 and chat["usage"]["prompt_tokens"] == len(want)
    bare = m.render_chat(MESSAGES, add_generation_prompt=False)
    got = post(served, "/tokenize", messages=MESSAGES, add_generation_prompt=False)
    assert got["tokens"] == m.tokenizer.encode(bare, add_special_tokens=False)
    assert len(got["tokens"]) < len(want)
    strs = post(served, "/tokenize", prompt="the", return_token_strs=True)
    assert strs["token_strs"] == [m.token_text(i) for i in strs["tokens"]]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"content": 5}, "invalid_type", "content"),
        ({"content": "x", "with_pieces": "yes"}, "invalid_type", "with_pieces"),
        ({"content": "x", "add_special": 1}, "invalid_type", "add_special"),
        ({"content": "x", "prompt": "y"}, "unsupported_parameter", "prompt"),
        ({"messages": MESSAGES, "prompt": "y"}, "unsupported_parameter", "prompt"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_type", "messages[0].role"),
        ({"messages": "hi"}, "invalid_type", "messages"),
        ({"messages": MESSAGES, "add_generation_prompt": "no"}, "invalid_type", None),
        ({"prompt": "x", "return_token_strs": 1}, "invalid_type", "return_token_strs"),
    ],
)
def test_tokenize_form_errors(
    served: Running, body: dict[str, Any], code: str, param: str | None
) -> None:
    status, _, data = call(served.url, "POST", "/tokenize", json.dumps(body))
    expect(status, data, 400, code, param)
    assert "\n" not in data["error"]["message"]


def test_lm_eval_remote_tokenizer_reads_the_server(served: Running) -> None:
    import_or_skip("lm_eval", "the test extra (lm-eval) is not installed")
    from lm_eval.utils import RemoteTokenizer

    m = served.model
    remote = RemoteTokenizer(served.url + "/v1/completions", timeout=30, max_retries=1)
    assert remote.eos_token_id == m.tokenizer.eos_ids[0]
    assert remote.bos_token_id == m.tokenizer.bos_id
    ids = remote.encode(TEXT)
    assert ids == m.tokenizer.encode(TEXT, add_special_tokens=False)
    assert remote.decode(ids) == TEXT
    # lm-eval renders the template it is given (this one uses no bos_token): the server's text
    assert remote.apply_chat_template(MESSAGES) == m.render_chat(MESSAGES)


def test_tokenizer_info_reports_the_chat_template_in_use(tiny_artifact: Path) -> None:
    from .conftest import start_server

    srv = start_server(tiny_artifact, max_batch=1, chat_template="gemma")
    try:
        status, _, info = call(srv.url, "GET", "/tokenizer_info")
        assert status == 200
        assert info["chat_template"] == srv.model.tokenizer.chat_template
        assert info["chat_template"].startswith("{#- llmir-stop: <end_of_turn>")
    finally:
        srv.stop()
