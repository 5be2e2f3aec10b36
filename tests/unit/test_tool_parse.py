"""Tool calls read back from answers (llmir_core.serve.tool_parse) in each format, whole and
streamed piece by piece, and the built-in tool-aware chat templates rendered on a conversation
with tools, a call and its result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmir_core.runtime.chat_template import render_chat
from llmir_core.serve.tool_parse import (
    ToolReader,
    call_deltas,
    parse_calls,
    parse_forced,
    tool_format,
)

TEMPLATES = Path(__file__).parents[2] / "llmir_core" / "runtime" / "chat_templates"
NAMES = {"get_weather", "get_time"}
PARIS = {"city": "Paris", "unit": "c"}


def calls_of(text: str, fmt: Any) -> tuple[str | None, list[tuple[str, Any]]]:
    content, calls = parse_calls(text, fmt, NAMES)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(
    "fmt, text, want",
    [
        (
            "hermes",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
            "</tool_call>",
            (None, [("get_weather", PARIS)]),
        ),
        (  # text before the call is the content; two calls; the last tag may be cut off
            "hermes",
            'Let me look.\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',
            ("Let me look.", [("get_time", {}), ("get_weather", PARIS)]),
        ),
        (  # arguments given as JSON text
            "hermes",
            '<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>',
            (None, [("get_time", {"tz": "UTC"})]),
        ),
        (
            "llama3_json",
            '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}',
            (None, [("get_weather", PARIS)]),
        ),
        (
            "llama3_json",
            '<|python_tag|>{"name": "get_time", "parameters": {}}; '
            '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',
            (None, [("get_time", {}), ("get_weather", PARIS)]),
        ),
        (
            "mistral",
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]',
            (None, [("get_weather", PARIS)]),
        ),
        (  # the tag is a special token: a decoded answer may hold only the array
            "mistral",
            '[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {"a": 1}}]',
            (None, [("get_time", {}), ("get_time", {"a": 1})]),
        ),
        (  # Mistral's [ARGS] form, decoded: the tags (special tokens) dropped
            "mistral_args",
            'get_weather{"city": "Paris", "unit": "c"}',
            (None, [("get_weather", PARIS)]),
        ),
        (  # ... or kept as text; text before; two calls
            "mistral_args",
            'Sure. [TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", '
            '"unit": "c"}',
            ("Sure.", [("get_time", {}), ("get_weather", PARIS)]),
        ),
        (  # a name in the prose that is not a call, then the call
            "mistral_args",
            'Calling get_time now: get_time{"tz": "UTC"}',
            ("Calling get_time now:", [("get_time", {"tz": "UTC"})]),
        ),
    ],
)
def test_parse_calls(fmt: str, text: str, want: tuple[Any, Any]) -> None:
    assert calls_of(text, fmt) == want


@pytest.mark.parametrize(
    "fmt, text",
    [
        ("hermes", "Paris is sunny today."),
        ("hermes", '<tool_call>{"name": "get_stock", "arguments": {}}</tool_call>'),  # unknown
        ("hermes", '<tool_call>{"name": "get_time", "arguments": {"tz": </tool_call>'),  # cut
        ("hermes", '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>'),  # not object
        ("hermes", '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> and more'),
        ("llama3_json", 'The call would be {"name": "get_time", "parameters": {}}'),
        ("llama3_json", '{"name": "get_time", "parameters": {}} trailing words'),
        ("llama3_json", '{"city": "Paris"}'),  # JSON, not a call
        ("mistral", "[TOOL_CALLS] not json"),
        ("mistral", "[1, 2]"),
        ("mistral_args", "get_weather is what I would call"),
        ("mistral_args", 'get_stock{"a": 1}'),  # not offered
        ("mistral_args", 'get_time{"tz": "UTC"} and more'),  # text after the call
        ("mistral_args", 'get_time{"tz": '),  # cut
        ("mistral_args", "get_time[1]"),  # not an object
    ],
)
def test_not_a_call(fmt: str, text: str) -> None:
    """No call, or a malformed one: parse_calls refuses, and a reader keeps the text."""
    with pytest.raises(ValueError):
        parse_calls(text, fmt, NAMES)  # type: ignore[arg-type]
    assert ToolReader(fmt, NAMES).read(text) == (text, [])  # type: ignore[arg-type]


def stream(reader: ToolReader, text: str, size: int) -> tuple[str, list[Any]]:
    """Feed text in pieces of `size` characters: (all content sent, the calls)."""
    sent = "".join(reader.feed(text[i : i + size]) for i in range(0, len(text), size))
    rest, calls = reader.finish()
    return sent + rest, calls


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize(
    "fmt, text, content, held_from",
    [
        (
            "hermes",
            'Checking.  \n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            "Checking.",
            "<tool_call>",
        ),
        ("hermes", "No call here <tool_ca", "No call here <tool_ca", None),
        ("llama3_json", ' {"name": "get_time", "parameters": {}}', "", "{"),
        ("llama3_json", "Plain {text} answer", "Plain {text} answer", None),
        ("mistral", 'Sure [TOOL_CALLS][{"name": "get_time", "arguments": {}}]', "Sure", "["),
        ("mistral_args", 'Sure. get_time{"tz": "UTC"}get_time{}', "Sure.", "get_time"),
        (
            "mistral_args",
            "I know get_time and get_weather.",
            "I know get_time and get_weather.",
            None,
        ),
        ("mistral_args", "Ends with get_ti", "Ends with get_ti", None),
    ],
)
def test_reader_stream(fmt: Any, text: str, content: str, held_from: str | None, size: int) -> None:
    """Streamed content equals the whole answer's, and no call text leaks into it."""
    whole = ToolReader(fmt, NAMES).read(text)
    reader = ToolReader(fmt, NAMES)
    sent, calls = stream(reader, text, size)
    assert sent == content == (whole[0] or "")
    assert [c.name for c in calls] == [c.name for c in whole[1]]
    if held_from is not None:
        assert held_from not in sent and calls


def test_reader_parallel_and_forced() -> None:
    two = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert len(ToolReader("hermes", NAMES).read(two)[1]) == 2
    assert [c.name for c in ToolReader("hermes", NAMES, parallel=False).read(two)[1]] == [
        "get_time"
    ]
    named = ToolReader("hermes", NAMES, forced=True, named="get_weather")
    content, calls = named.read('{"city": "Paris", "unit": "c"}')
    assert content is None and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == PARIS
    assert named.feed('{"city"') == ""  # a forced answer is never content while it streams
    got = parse_forced('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", '
                       '"arguments": {"city": "Rome"}}]', NAMES)  # fmt: skip
    assert [(c.name, json.loads(c.arguments)) for c in got] == [
        ("get_time", {}),
        ("get_weather", {"city": "Rome"}),
    ]
    for bad in ('{"name": "nope", "arguments": {}}', "[]", "{", '"x"'):
        with pytest.raises(ValueError):
            parse_forced(bad, NAMES)


def test_call_deltas_join_to_the_call() -> None:
    """What the openai SDK's accumulator does with the deltas: index, id, name, then the
    arguments appended."""
    calls = ToolReader("hermes", NAMES).read(
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
        '</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )[1]
    joined: dict[int, dict[str, str]] = {}
    for delta in call_deltas(calls):
        for d in delta["tool_calls"]:
            slot = joined.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += d.get("id", "")
            slot["name"] += d.get("function", {}).get("name", "")
            slot["arguments"] += d["function"].get("arguments", "")
    assert [(j["id"], j["name"], j["arguments"]) for j in joined.values()] == [
        (c.id, c.name, c.arguments) for c in calls
    ]
    assert all(c.id.startswith("call_") for c in calls)


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def test_tool_format_of_templates() -> None:
    assert tool_format(template("chatml")) == "hermes"
    assert tool_format(template("llama3")) == "llama3_json"
    assert tool_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    v11 = "{{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' + arguments }}"
    assert tool_format(v11) == "mistral_args"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
]

CHATML_WANT = """<|im_start|>system
Be brief.

# Tools

You may call one or more of the functions below to answer. Their signatures are inside <tools></tools>, one JSON object per line:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "The weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
</tools>

To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> tags, one block per call:
<tool_call>
{"name": <function-name>, "arguments": <arguments-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
18C
</tool_response><|im_end|>
<|im_start|>assistant
"""

LLAMA3_WANT = """<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>

You can call the functions below. To call one, answer with nothing but a JSON object of the form {"name": function name, "parameters": object of argument names and values}. Write the values themselves, not variables.

{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string"
                }
            }
        }
    }
}

Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>

18C<|eot_id|><|start_header_id|>assistant<|end_header_id|>

"""


def test_chatml_template_with_tools() -> None:
    got = render_chat(template("chatml"), CONVERSATION, tools=[WEATHER])
    assert got == CHATML_WANT
    # the call the template shows parses back to the same call
    block = got.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert calls_of(block, "hermes") == (None, [("get_weather", {"city": "Paris"})])


def test_chatml_template_without_tools() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    want = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    assert render_chat(template("chatml"), messages, add_generation_prompt=False) == want


def test_llama3_template_with_tools() -> None:
    got = render_chat(
        template("llama3"),
        CONVERSATION,
        tools=[WEATHER],
        bos_token="<|begin_of_text|>",
        date_string="26 Jul 2024",
    )
    assert got == LLAMA3_WANT
    block = got.split("<|end_header_id|>\n\n")[-3].split("<|eot_id|>")[0]
    assert calls_of(block, "llama3_json") == (None, [("get_weather", {"city": "Paris"})])


def test_llama3_template_without_tools() -> None:
    got = render_chat(
        template("llama3"), [{"role": "user", "content": " hi "}], date_string="1 Jan 2025"
    )
    assert got == (
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 1 Jan 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_templates_ship_as_package_data() -> None:
    """The wheel carries every built-in template (pyproject's package-data)."""
    import fnmatch

    import tomllib

    config = tomllib.loads((TEMPLATES.parents[2] / "pyproject.toml").read_text())
    setup = config["tool"]["setuptools"]
    assert "llmir_core.runtime.chat_templates" in setup["packages"]
    patterns = setup["package-data"]["llmir_core.runtime.chat_templates"]
    files = [p.name for p in TEMPLATES.iterdir() if p.suffix == ".jinja"]
    assert {"chatml.jinja", "llama3.jinja", "gemma.jinja"} <= set(files)
    assert all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files)


def test_mistral_call_ids() -> None:
    """Mistral's templates accept only 9-character ids: answers get such ids, and longer ids
    coming back in messages are cut to their last 9 characters before the template."""
    from llmir_core.serve.tools import template_messages

    calls = ToolReader("mistral", NAMES).read('[{"name": "get_time", "arguments": {}}]')[1]
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    calls = ToolReader("mistral_args", NAMES).read("get_time{}")[1]
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    mistral = (
        "{%- for m in messages %}{%- for c in m.tool_calls or [] %}"
        "{%- if c.id | length != 9 %}{{ raise_exception('ids of 9') }}{% endif %}{{ c.id }}"
        "{%- endfor %}{{ m.tool_call_id or '' }}{%- endfor %}[TOOL_CALLS]"
    )
    messages = [
        CONVERSATION[1],
        {
            **CONVERSATION[2],
            "tool_calls": [{**CONVERSATION[2]["tool_calls"][0], "id": "call_0123456789abcdef"}],  # type: ignore[index]
        },
        {**CONVERSATION[3], "tool_call_id": "call_0123456789abcdef"},
    ]
    got = render_chat(mistral, template_messages(messages, mistral))
    assert got == "789abcdef789abcdef[TOOL_CALLS]"
    assert template_messages(messages, template("chatml")) is messages
