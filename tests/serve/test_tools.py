"""`tools`, `tool_choice` and `parallel_tool_calls` on /v1/chat/completions, through the openai
SDK, with the tiny model served under the built-in chatml template (Hermes tool calls).

The tiny model has random weights, so it never calls a tool by itself. For "auto", the server
here wraps its decoder in `Scripted`: while a script is set, every generated position's logits
put all the probability on the script's next token (then end-of-sequence), as a model trained
to call tools would; the template, the parsing and the answers are the server's own. The
forced choices ("required", a named function) run on the model's own logits: their outputs
parse only because a grammar constrains them (they need the grammar branch's token mask).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.json_schema import validate
from llmir_core.runtime.chat_template import render_chat
from llmir_core.runtime.grammar_spec import GrammarSpec
from llmir_core.serve.schemas import parse_chat
from tests.decoder.tiny import TINY, make_llama_folder

from .conftest import Running

openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")

CHATML = (
    Path(__file__).parents[2] / "llmir_core" / "runtime" / "chat_templates" / "chatml.jinja"
).read_text()
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "detailed": {"type": "boolean"},
    },
    "required": ["city", "unit", "detailed"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time", "parameters": TIME_PARAMS},
    },
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'


class Scripted:
    """A batch decoder whose logits, while `script` is set, make every sampler write the
    script after the last `<|im_start|>assistant\\n` of a sequence, then end it; otherwise the
    wrapped decoder's own logits."""

    def __init__(self, inner: Any, marker: list[int], encode: Any, eos: int) -> None:
        self.inner = inner
        self.marker = marker
        self.encode = encode
        self.eos = eos
        self.script: list[int] | None = None
        self.free = False  # after the script: the model's own logits (else end-of-sequence)
        self.seqs: dict[int, list[int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def set_script(self, text: str | None, free: bool = False) -> None:
        self.script = None if text is None else self.encode(text)
        self.free = free

    def _force(self, slot: int, row: np.ndarray) -> np.ndarray:
        seq, m = self.seqs[slot], len(self.marker)
        if self.script is None:
            return row
        starts = [i + m for i in range(len(seq) - m + 1) if seq[i : i + m] == self.marker]
        at = max(starts, default=len(seq))
        done = len(seq) - at
        if self.free and done >= len(self.script):
            return row
        want = self.script[done] if done < len(self.script) else self.eos
        out = np.full_like(row, -1e4)
        out[want] = 1e4
        return out

    def _saw(self, slot: int, ids: Any, start: int) -> None:
        self.seqs[slot] = self.seqs.get(slot, [])[:start] + [int(i) for i in ids]

    def prefill(self, slot: int, ids: Any, start: int) -> np.ndarray:
        self._saw(slot, ids, start)
        return self._force(slot, np.asarray(self.inner.prefill(slot, ids, start)))

    def prefill_rows(self, slot: int, ids: Any, start: int) -> np.ndarray:
        self._saw(slot, ids, start)
        rows = np.array(self.inner.prefill_rows(slot, ids, start))
        rows[-1] = self._force(slot, rows[-1])
        return rows

    def decode(self, slots: Any, ids: Any, positions: Any) -> np.ndarray:
        for s, i, p in zip(slots, ids, positions):
            self._saw(s, [i], p)
        rows = np.array(self.inner.decode(slots, ids, positions))
        return np.stack([self._force(s, r) for s, r in zip(slots, rows)])

    def fork(self, src_slot: int, dst_slots: Any, length: int) -> None:
        self.inner.fork(src_slot, dst_slots, length)
        for d in dst_slots:
            self.seqs[d] = self.seqs.get(src_slot, [])[:length]

    def step(self, rows: Any) -> np.ndarray:
        for s, ids, start in rows:
            self._saw(s, ids, start)
        out = np.array(self.inner.step(rows))
        return np.stack([self._force(s, r) for (s, _, _), r in zip(rows, out)])


@pytest.fixture(scope="module")
def tool_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a 2048-token context: its tokenizer is character-level, and the
    tools' system turn alone is about 1000 characters."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    folder = make_llama_folder(
        tmp_path_factory.mktemp("tools") / "llama", replace(TINY, context=2048)
    )
    out = tmp_path_factory.mktemp("art_tools") / "llama"
    build_decoder(import_hf(folder), str(out))
    return out


def serve_scripted(artifact: Path, template: str) -> Running:
    """The tiny model under `template` (`--chat-template`), its decoder `Scripted` (no
    script: its own logits)."""
    import urllib.request

    from llmir_core.serve.model import ServedModel, open_served_model
    from llmir_core.serve.server import bind, make_server

    opened = open_served_model(
        str(artifact), threads=1, max_batch=4, max_queue=8, chunk=64, chat_template=template
    )
    tok = opened.tokenizer
    marker = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    scripted = Scripted(
        opened.decoder,
        marker,
        lambda t: tok.encode(t, add_special_tokens=False),
        tok.eos_ids[0],
    )
    model = ServedModel(opened.name, opened.manifest, tok, scripted, chunk=64)  # type: ignore[arg-type]
    sock = bind("127.0.0.1", 0)
    server = make_server(model)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=5).read()
            break
        except OSError:
            time.sleep(0.05)
    return Running(url, model, server, thread)


@pytest.fixture(scope="module")
def tool_served(tool_artifact: Path) -> Iterator[Running]:
    """The tiny model under the chatml template (Hermes calls)."""
    run = serve_scripted(tool_artifact, "chatml")
    assert run.model.tokenizer.chat_template == CHATML  # `--chat-template chatml`
    yield run
    run.stop()


@pytest.fixture
def script(tool_served: Running) -> Iterator[Any]:
    """Set the scripted answer (None: the model's own); reset after the test."""
    dec = tool_served.model.decoder
    yield dec.set_script
    dec.set_script(None)


def client(run: Running) -> Any:
    return openai.OpenAI(base_url=run.url + "/v1", api_key="unused", max_retries=0)


def chat(run: Running, **kw: Any) -> Any:
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 300)
    kw.setdefault("temperature", 0)
    return client(run).chat.completions.create(model=run.model.name, **kw)


def prompt_tokens(run: Running, messages: Any, tools: Any) -> int:
    """The tokens of the chatml rendering of messages with tools (the caller's own render)."""
    text = render_chat(CHATML, messages, **({} if tools is None else {"tools": tools}))
    return len(run.model.tokenizer.encode(text, add_special_tokens=False))


def calls(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_tools_auto(tool_served: Running, script: Any) -> None:
    # the model's own text (no call) stays content; the template got the tools
    plain = chat(tool_served, tools=TOOLS)
    msg = plain.choices[0].message
    assert msg.tool_calls is None and msg.content and plain.choices[0].finish_reason != "tool_calls"
    assert plain.usage.prompt_tokens == prompt_tokens(tool_served, ASK, TOOLS)
    # a model that calls: the call becomes tool_calls, the text before it the content
    script("Let me check.\n" + CALL)
    got = chat(tool_served, tools=TOOLS, tool_choice="auto")
    msg = got.choices[0].message
    assert msg.content == "Let me check."
    assert calls(msg) == [("get_weather", {"city": "Paris", "unit": "c"})]
    assert msg.tool_calls[0].id.startswith("call_") and msg.tool_calls[0].type == "function"
    assert got.choices[0].finish_reason == "tool_calls"
    # a call of a function not offered, or with arguments that do not parse, stays content
    for bad in (CALL.replace("get_weather", "get_stock"), CALL.replace('"c"}', '"c"')):
        script(bad)
        got = chat(tool_served, tools=TOOLS)
        assert got.choices[0].message.content == bad and got.choices[0].message.tool_calls is None
        assert got.choices[0].finish_reason == "stop"
    # the next turn: the call and its result reach the template (arguments as an object)
    turn = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
    ]
    script("It is 18C and sunny.")
    got = chat(tool_served, tools=TOOLS, messages=turn)
    assert got.choices[0].message.content == "It is 18C and sunny."
    want = [
        *ASK,
        {**turn[1], "content": ""},
        turn[2],
    ]
    want[1]["tool_calls"] = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    ]
    assert got.usage.prompt_tokens == prompt_tokens(tool_served, want, TOOLS)


def test_tools_need_a_tool_template(served: Running) -> None:
    """The tiny model's own template never reads `tools`: a 400 naming them, unless
    tool_choice is "none"."""
    with pytest.raises(openai.BadRequestError) as err:
        chat(served, tools=TOOLS, max_tokens=2)
    assert err.value.param == "tools" and "does not use 'tools'" in err.value.message
    got = chat(served, tools=TOOLS, tool_choice="none", max_tokens=2)
    assert got.choices[0].message.tool_calls is None


@pytest.mark.parametrize(
    "kw, param",
    [
        (
            {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools[0].type"),
        ({"tools": []}, "tools"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}]},
            "tools[0].function.returns",
        ),
        (
            {
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "get_time", "x": 1}},
            },
            "tool_choice.function.x",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"messages": [*ASK, {"role": "tool", "content": "18C"}]}, "messages[1].tool_call_id"),
        (
            {"messages": [*ASK, {"role": "tool", "tool_call_id": "c", "content": "1"}]},
            "messages[1].role",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_tool_request_errors(tool_served: Running, kw: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        chat(tool_served, max_tokens=2, **kw)
    assert err.value.param == param, err.value.message


def test_no_tools_on_completions(tool_served: Running) -> None:
    for kw in ({"tools": TOOLS}, {"tool_choice": "none"}, {"parallel_tool_calls": False}):
        with pytest.raises(openai.BadRequestError) as err:
            client(tool_served).completions.create(
                model=tool_served.model.name, prompt="x", max_tokens=1, extra_body=kw
            )
        assert err.value.param == next(iter(kw)) and err.value.code == "unknown_parameter"
        assert "/v1/chat/completions" in err.value.message


def test_tool_choice_none(tool_served: Running, script: Any) -> None:
    """ "none": the template gets no tools and the answer is text, even one shaped as a call."""
    script(CALL)
    got = chat(tool_served, tools=TOOLS, tool_choice="none")
    assert got.choices[0].message.content == CALL and got.choices[0].message.tool_calls is None
    assert got.choices[0].finish_reason == "stop"
    assert got.usage.prompt_tokens == prompt_tokens(tool_served, ASK, None)
    assert chat(tool_served).usage.prompt_tokens == got.usage.prompt_tokens  # as without tools


def test_parallel_tool_calls(tool_served: Running, script: Any) -> None:
    two = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    script(two)
    both = chat(tool_served, tools=TOOLS)
    assert calls(both.choices[0].message) == [
        ("get_weather", {"city": "Paris", "unit": "c"}),
        ("get_time", {"zone": "UTC"}),
    ]
    assert len({c.id for c in both.choices[0].message.tool_calls}) == 2
    one = chat(tool_served, tools=TOOLS, parallel_tool_calls=False)
    assert calls(one.choices[0].message) == calls(both.choices[0].message)[:1]
    # forced: an array of calls, or one call when parallel calls are off
    body = {"model": "m", "messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    array = parse_chat(body).grammar
    single = parse_chat({**body, "parallel_tool_calls": False}).grammar
    assert array is not None and array.value["type"] == "array"
    assert single is not None and single.value == array.value["items"]


def check_calls(message: Any, names: set[str]) -> None:
    """Each call names an offered function and its arguments validate against its schema."""
    assert message.tool_calls, message.content
    for c in message.tool_calls:
        assert c.function.name in names
        args = json.loads(c.function.arguments)
        assert validate(args, SCHEMAS[c.function.name]) == [], c.function.arguments


def test_tool_choice_named(tool_served: Running) -> None:
    """A named function: the output is constrained to its arguments' schema (needs the
    grammar's token mask), at temperature 1, whatever the seed."""
    body = {"model": "m", "messages": ASK, "tools": TOOLS}
    named = {"type": "function", "function": {"name": "get_time"}}
    assert parse_chat({**body, "tool_choice": named}).grammar == GrammarSpec(
        "json_schema", TIME_PARAMS, "tool_choice"
    )
    for seed in range(4):
        got = chat(tool_served, tools=TOOLS, tool_choice=named, temperature=1, seed=seed)
        msg = got.choices[0].message
        check_calls(msg, {"get_time"})
        assert len(msg.tool_calls) == 1 and msg.content is None
        assert got.choices[0].finish_reason == "tool_calls"
    # streamed: the same call (the same seed), held whole and sent as deltas
    with client(tool_served).chat.completions.stream(
        model=tool_served.model.name,
        messages=ASK,
        tools=TOOLS,
        tool_choice=named,
        max_tokens=300,
        temperature=1,
        seed=3,
    ) as stream:
        for event in stream:
            assert event.type != "content.delta" or not event.delta, event
        final = stream.get_final_completion().choices[0]
    assert calls(final.message) == calls(msg) and final.finish_reason == "tool_calls"


def test_tool_choice_required(tool_served: Running) -> None:
    """ "required": one call or more, each of an offered function with arguments that validate
    (needs the grammar's token mask), at temperature 1, whatever the seed."""
    for seed in range(4):
        for parallel in (True, False):
            got = chat(
                tool_served,
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=parallel,
                temperature=1,
                seed=seed,
                max_tokens=900,  # room for many calls: the array ends when the model says so
            )
            check_calls(got.choices[0].message, set(SCHEMAS))
            assert parallel or len(got.choices[0].message.tool_calls) == 1
            assert got.choices[0].finish_reason == "tool_calls"


def test_tool_calls_stream(tool_served: Running, script: Any) -> None:
    """Streamed: text deltas stop where the call starts; the call comes as `delta.tool_calls`
    that the SDK's accumulator joins into the same answer as without streaming."""
    script("Let me check.\n" + CALL)
    whole = chat(tool_served, tools=TOOLS).choices[0]
    chunks = list(chat(tool_served, tools=TOOLS, stream=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == whole.message.content == "Let me check."
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert deltas and deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with client(tool_served).chat.completions.stream(
        model=tool_served.model.name, messages=ASK, tools=TOOLS, max_tokens=120, temperature=0
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.message.content == "Let me check."
    assert calls(final.message) == calls(whole.message)
    assert final.finish_reason == "tool_calls"
    # text that is not a call comes back whole, held text included
    script("No call <tool_call> here")
    chunks = list(chat(tool_served, tools=TOOLS, stream=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == "No call <tool_call> here"
    assert chunks[-1].choices[0].finish_reason == "stop"


def strict(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**t, "function": {**t["function"], "strict": True}} for t in tools]


def strict_call(run: Running, **kw: Any) -> Any:
    """A sampled chat with the tools marked strict, one call at most."""
    return chat(
        run, tools=strict(TOOLS), temperature=1, parallel_tool_calls=False, max_tokens=400, **kw
    )


def test_auto_strict_calls_follow_the_schema(tool_served: Running, script: Any) -> None:
    """ "auto" with strict tools: once the model opens a call (scripted: text, then
    `<tool_call>`), the model's own logits go on under the grammar, and the call's arguments
    follow its function's schema; the same without `strict` is the random model's text."""
    script("Let me check.\n<tool_call>", free=True)
    first: Any = None
    for seed in (0, 1):  # one call (parallel ones: tests/unit/test_tool_grammar.py)
        got = strict_call(tool_served, seed=seed)
        msg = got.choices[0].message
        first = first if seed else msg
        assert msg.content == "Let me check." and got.choices[0].finish_reason == "tool_calls"
        check_calls(msg, set(SCHEMAS))
        assert len(msg.tool_calls) == 1
    chunks = list(strict_call(tool_served, seed=0, stream=True))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    streamed = json.loads("".join(d.function.arguments or "" for d in deltas))
    assert streamed == calls(first)[0][1]  # as the same request without streaming
    free = chat(tool_served, tools=TOOLS, temperature=1, seed=0, max_tokens=60)
    assert free.choices[0].message.tool_calls is None
    assert free.choices[0].message.content.startswith("Let me check.\n<tool_call>")


def test_auto_tools_with_a_response_format(tool_served: Running, script: Any) -> None:
    """ "auto" tools and response_format together: the answer is the format's JSON, or calls."""
    answer = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": answer, "strict": True}}
    lt = tool_served.model.tokenizer.token_to_id("<")
    got = chat(tool_served, tools=TOOLS, response_format=fmt, logit_bias={str(lt): -100})
    assert json.loads(got.choices[0].message.content) in ({"ok": True}, {"ok": False})
    assert got.choices[0].message.tool_calls is None
    script("<tool_call>", free=True)
    got = strict_call(tool_served, response_format=fmt, seed=3)
    check_calls(got.choices[0].message, set(SCHEMAS))
    assert got.choices[0].message.content is None


def test_tool_choice_named_with_n(tool_served: Running) -> None:
    """n > 1 with a forced choice: every choice has its own constraint (all parse), its own
    reader (every choice's message becomes a call), and choice 0 is the n=1 answer."""
    named = {"type": "function", "function": {"name": "get_time"}}
    one = chat(tool_served, tools=TOOLS, tool_choice=named, temperature=1, seed=5)
    got = chat(tool_served, tools=TOOLS, tool_choice=named, temperature=1, seed=5, n=3)
    assert [c.index for c in got.choices] == [0, 1, 2]
    for c in got.choices:
        check_calls(c.message, {"get_time"})
        assert c.finish_reason == "tool_calls" and c.message.content is None
    assert calls(got.choices[0].message) == calls(one.choices[0].message)


def test_tool_calls_stream_with_n(tool_served: Running, script: Any) -> None:
    """Streamed n > 1 with tools: each choice's calls come as its own `delta.tool_calls` (by
    `index`), equal to the same request without streaming; each choice ends "tool_calls"."""
    named = {"type": "function", "function": {"name": "get_time"}}
    kw: dict[str, Any] = {"tools": TOOLS, "temperature": 1, "seed": 5, "n": 3}
    whole = chat(tool_served, tool_choice=named, **kw)
    chunks = list(chat(tool_served, tool_choice=named, stream=True, **kw))
    for c in whole.choices:
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == c.index]
        deltas = [d for m in mine for d in m.delta.tool_calls or []]
        assert deltas[0].function.name == "get_time"
        args = json.loads("".join(d.function.arguments or "" for d in deltas))
        assert [("get_time", args)] == calls(c.message)
        assert not "".join(m.delta.content or "" for m in mine)  # a forced call has no text
        assert mine[-1].finish_reason == "tool_calls"
    # "auto", scripted: text then the call, for every choice
    script("Let me check.\n" + CALL)
    chunks = list(chat(tool_served, stream=True, **kw))
    for k in range(3):
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == k]
        assert "".join(m.delta.content or "" for m in mine) == "Let me check."
        deltas = [d for m in mine for d in m.delta.tool_calls or []]
        assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {
            "city": "Paris",
            "unit": "c",
        }
        assert mine[-1].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None and not chunks[-1].choices


MISTRAL_ARGS_TEMPLATE = """{#- llmir-stop: <|im_end|> -#}
{#- Mistral's [ARGS] call form in a ChatML frame (so `Scripted` finds the answer's start) -#}
{%- if tools -%}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' and m.tool_calls -%}
{{- '<|im_start|>assistant\\n' -}}
{%- for c in m.tool_calls -%}
{%- set a = c.function.arguments -%}
{{- '[TOOL_CALLS]' ~ c.function.name ~ '[ARGS]' ~ (a if a is string else a | tojson) -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif m.role == 'tool' -%}
{%- if m.tool_call_id | length != 9 -%}{{ raise_exception('ids of 9') }}{%- endif -%}
{{- '[TOOL_RESULTS]' ~ m.tool_call_id ~ ' ' ~ m.content ~ '[/TOOL_RESULTS]' -}}
{%- else -%}
{{- '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


@pytest.fixture(scope="module")
def mistral_served(
    tool_artifact: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    path = tmp_path_factory.mktemp("tpl") / "mistral_args.jinja"
    path.write_text(MISTRAL_ARGS_TEMPLATE)
    run = serve_scripted(tool_artifact, str(path))
    yield run
    run.stop()


def test_mistral_args_form(mistral_served: Running) -> None:
    """A template with `[TOOL_CALLS]name[ARGS]{...}`: the answer is read in that form (whole
    and streamed), ids have 9 characters (the template refuses others on the next turn), and
    strict arguments are constrained once the model opens a call."""
    dec = mistral_served.model.decoder
    try:
        dec.set_script('Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}')
        got = chat(mistral_served, tools=TOOLS)
        msg = got.choices[0].message
        assert msg.content == "Sure." and got.choices[0].finish_reason == "tool_calls"
        assert calls(msg) == [("get_weather", {"city": "Paris", "unit": "c"})]
        cid = msg.tool_calls[0].id
        assert len(cid) == 9
        chunks = list(chat(mistral_served, tools=TOOLS, stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == "Sure." and chunks[-1].choices[0].finish_reason == "tool_calls"
        turn = [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [msg.tool_calls[0].model_dump()]},
            {"role": "tool", "tool_call_id": cid, "content": "18C"},
        ]
        dec.set_script("It is 18C.")
        assert chat(mistral_served, tools=TOOLS, messages=turn).choices[0].message.content == (
            "It is 18C."
        )
        dec.set_script("[TOOL_CALLS]", free=True)
        got = strict_call(mistral_served, seed=2)
        check_calls(got.choices[0].message, set(SCHEMAS))
        assert got.choices[0].message.content is None
    finally:
        dec.set_script(None)
