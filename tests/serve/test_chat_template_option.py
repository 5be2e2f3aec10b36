"""`--chat-template NAME|FILE` on `llmir run` and `llmir serve`: a built-in name or a Jinja file
replaces the model's template, renders in the same sandbox, and the end-of-turn token it
declares stops generation; a bad name or file is one line, exit 2, before the model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.runtime.chat_template import render_chat
from llmir_core.runtime.chat_templates import (
    MAX_TEMPLATE_BYTES,
    builtin_names,
    declared_stops,
    load_chat_template,
)

from .conftest import start_server
from .test_openai_api import client, run_text

MESSAGES = [{"role": "user", "content": "Tell me a story"}]
# a plain template with the tiny model's ChatML-free format
PLAIN = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "


def test_builtins_include_gemma_and_render_its_turns() -> None:
    assert "gemma" in builtin_names()
    tpl = load_chat_template("gemma")
    assert tpl.stop == ("<end_of_turn>",)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    text = render_chat(tpl.text, messages, bos_token="<bos>")
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(InputError, match="only as the first message"):
        render_chat(tpl.text, [*messages, {"role": "system", "content": "late"}])


def test_declared_stops() -> None:
    assert declared_stops("{#- llmir-stop: <|im_end|> <|endoftext|> -#}x") == (
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert declared_stops("{# llmir-stop: <eot> #}") == ("<eot>",)
    assert declared_stops("{{ messages }}") == ()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not a built-in template (" + ", ".join(builtin_names()) + ") and no such file"),
        (b"\xff\xfe{{ x }}", "not UTF-8 text"),
        (b"{% for m in messages %}", "the template does not render: line"),
        (b"{{ raise_exception('no') }}", "the template does not render: no"),
        (b"x" * (MAX_TEMPLATE_BYTES + 1), f"at most {MAX_TEMPLATE_BYTES}"),
    ],
)
def test_bad_template_is_one_line_exit_2_before_the_model_loads(
    tiny_artifact: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    content: bytes | None,
    message: str,
) -> None:
    path = tmp_path / "t.jinja"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError) as err:
        load_chat_template(str(path))
    assert message in str(err.value) and "\n" not in str(err.value)

    def no_load(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded")

    import llmir_core.targets as targets

    monkeypatch.setattr(targets, "open_batch_artifact", no_load)
    monkeypatch.setattr(targets, "open_artifact", no_load)
    for cmd in (["serve", str(tiny_artifact)], ["run", str(tiny_artifact), "-p", "hi"]):
        res = CliRunner().invoke(app, [*cmd, "--chat-template", str(path)])
        assert res.exit_code == 2, res.output
        assert message in res.output and "Traceback" not in res.output


def test_run_and_serve_use_the_file_template(tiny_artifact: Path, tmp_path: Path) -> None:
    """The file's template replaces the model's (ChatML) on both commands; /tokenizer_info
    reports it."""
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN)
    want = run_text(tiny_artifact, MESSAGES, max_new_tokens=8, chat_template=str(path), chat=True)
    chatml = run_text(tiny_artifact, MESSAGES, max_new_tokens=8, chat=True)
    assert want != chatml  # another prompt, another answer
    srv = start_server(tiny_artifact, max_batch=1, chat_template=str(path))
    try:
        got = client(srv).chat.completions.create(
            model=srv.model.name, messages=MESSAGES, max_tokens=8, temperature=0
        )
        assert got.choices[0].message.content == want
        assert srv.model.tokenizer.chat_template == PLAIN
    finally:
        srv.stop()


def test_declared_stop_token_ends_generation(tiny_artifact: Path, tmp_path: Path) -> None:
    """A template that declares one of the tokens the model generates as its end of turn: the
    answer stops right before it (finish_reason stop), on run and serve."""
    from llmir_core.runtime.textgen import TextGenerator, TextGenOptions

    plain = tmp_path / "plain.jinja"
    plain.write_text(PLAIN)
    opts = TextGenOptions(threads=1, chat=True, chat_template=str(plain), max_new_tokens=12)
    gen = TextGenerator(str(tiny_artifact), opts)
    ids = gen.generate(MESSAGES).result.ids
    stop_id = next(i for i in ids[2:] if i not in gen.tokenizer.eos_ids)
    token = gen.tokenizer.backend.id_to_token(stop_id)
    assert " " not in token and gen.tokenizer.token_to_id(token) == stop_id
    before = ids[: ids.index(stop_id)]
    declared = tmp_path / "declared.jinja"
    declared.write_text("{#- llmir-stop: " + token + " -#}\n" + PLAIN)
    srv = start_server(tiny_artifact, max_batch=1, chat_template=str(declared))
    try:
        assert stop_id in srv.model.eos_ids
        got = client(srv).chat.completions.create(
            model=srv.model.name, messages=MESSAGES, max_tokens=12, temperature=0
        )
        assert got.choices[0].finish_reason == "stop"
        assert got.choices[0].message.content == gen.tokenizer.decode(before)
        assert got.usage is not None and got.usage.completion_tokens == len(
            before
        )  # the EOS is not counted
    finally:
        srv.stop()
