"""`llmir serve` on the Gemma 3 270M base file's build with `--chat-template gemma`: the file ships
no chat template, so without the option it cannot chat; with it, chat requests through the openai
SDK render Gemma's turns, and `<end_of_turn>` is among the ids that end generation. (A base
model's answers are what they are: the check is that the request works and where it stops.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")
pytest.importorskip("starlette", reason="the serve extra (starlette) is not installed")

MESSAGES = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What colour is the sky?"},
]


def test_gemma_chats_with_the_builtin_template(gemma_artifact: Callable[[str], Path]) -> None:
    from tests.serve.conftest import start_server

    art = gemma_artifact("exact")
    srv = start_server(art, max_batch=2, chat_template="gemma", max_context=512)
    try:
        model = srv.model
        end_of_turn = model.tokenizer.token_to_id("<end_of_turn>")
        assert end_of_turn is not None and end_of_turn in model.eos_ids
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        got = c.chat.completions.create(
            model=model.name, messages=MESSAGES, max_tokens=16, temperature=0
        )
        choice = got.choices[0]
        assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
        text = model.render_chat(MESSAGES)
        assert text == (
            "<bos><start_of_turn>user\nAnswer in one word.\n\nWhat colour is the sky?"
            "<end_of_turn>\n<start_of_turn>model\n"
        )
        assert got.usage is not None
        assert got.usage.prompt_tokens == len(
            model.tokenizer.encode(text, add_special_tokens=False)
        )
        # forced to end its turn at once (logit_bias), the answer is empty and stops there
        try:
            ended = c.chat.completions.create(
                model=model.name,
                messages=MESSAGES,
                max_tokens=16,
                temperature=0,
                logit_bias={str(end_of_turn): 100},
            )
        except openai.BadRequestError as exc:
            assert exc.param == "logit_bias"
            pytest.skip("logit_bias is not honored on this branch yet")
        assert ended.choices[0].finish_reason == "stop"
        assert ended.choices[0].message.content == ""
    finally:
        srv.stop()
