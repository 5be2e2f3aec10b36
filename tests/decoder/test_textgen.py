"""Text generation on a decoder artifact: the core of `llmir run ARTIFACT --prompt`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.textgen import (
    TextGenerator,
    TextGenOptions,
    chat_loop,
    generate_texts,
    read_prompts_file,
    render_chat,
    results_json,
)
from llmir_core.targets.onnxruntime.runner import open_decoder

from .helpers import greedy
from .tiny import CHATML


def test_prompt_streams_greedy_text(tiny_artifact: Path) -> None:
    pieces: list[tuple[int, str]] = []
    [res] = generate_texts(
        str(tiny_artifact),
        ["the cat"],
        TextGenOptions(max_new_tokens=12),
        on_text=lambda i, p: pieces.append((i, p)),
    )
    r = res.result
    assert "".join(p for _, p in pieces) == r.text and {i for i, _ in pieces} == {0}
    assert r.prompt_ids[:3] == [100, 98, 16]  # "the" merged to one token, then " " and "c"
    assert r.ids == greedy(open_decoder(str(tiny_artifact)), r.prompt_ids, 12)
    assert r.stop_reason == "length" and len(r.ids) == 12 and r.decode_tokens_per_s > 0


def test_same_seed_same_text(tiny_artifact: Path) -> None:
    def run(seed: int) -> list[int]:
        opts = TextGenOptions(
            max_new_tokens=16,
            temperature=1.0,
            top_k=40,
            top_p=0.95,
            repetition_penalty=1.2,
            seed=seed,
        )
        return generate_texts(str(tiny_artifact), ["hello"], opts)[0].result.ids

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_stop_string_and_eos(tiny_artifact: Path) -> None:
    gen = TextGenerator(str(tiny_artifact), TextGenOptions(max_new_tokens=12))
    full = gen.generate("the cat").result
    visible = full.text
    assert len(visible) >= 4
    gen.options.stop = (visible[2:4],)
    cut = gen.generate("the cat").result
    assert cut.stop_reason == "stop_string" and cut.text == visible[: visible.index(visible[2:4])]
    gen.options.stop = ()
    gen.tokenizer.eos_ids = (full.ids[0],)
    eos = gen.generate("the cat").result
    assert eos.stop_reason == "eos" and eos.ids == []


def test_chat_template_is_full_jinja(tiny_artifact: Path) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert render_chat(CHATML, msgs) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tpl = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
        "{{ ns.n }}{{ messages[-1]['content'] | tojson }}{{ bos_token }}"
        "{% if messages | length > 2 %}{{ raise_exception('too many messages') }}{% endif %}"
    )
    assert render_chat(tpl, msgs, bos_token="<s>") == '2"hi"<s>'
    with pytest.raises(InputError, match="too many messages"):
        render_chat(tpl, msgs * 2)
    gen = TextGenerator(
        str(tiny_artifact), TextGenOptions(max_new_tokens=4, chat=True, system="be brief")
    )
    ids = gen.encode("hi")
    assert ids[0] == 1 and ids.count(1) == 3  # <|im_start|> is one special token, 3 turns
    assert gen.tokenizer.decode(ids, skip_special_tokens=False) == render_chat(CHATML, msgs)


def test_context_limit_stops_with_a_warning(tiny_artifact: Path) -> None:
    gen = TextGenerator(str(tiny_artifact), TextGenOptions(max_new_tokens=10))
    n = len(gen.encode("the cat"))
    gen = TextGenerator(str(tiny_artifact), TextGenOptions(max_new_tokens=10, max_context=n + 3))
    res = gen.generate("the cat")
    assert res.result.stop_reason == "context" and len(res.result.ids) == 4
    assert res.warnings == [
        f"generation stopped at the model's context limit of {n + 3} tokens after 4 new tokens"
    ]
    gen = TextGenerator(str(tiny_artifact), TextGenOptions(max_context=4))
    with pytest.raises(InputError, match="the prompt has 5 tokens, but the model's context is 4"):
        gen.generate("the cat")


def test_prompts_file_and_json(tiny_artifact: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("the cat\n\nhello\n")
    (tmp_path / "p.jsonl").write_text('"the cat"\n{"prompt": "hello"}\n')
    assert (
        read_prompts_file(str(tmp_path / "p.txt"))
        == read_prompts_file(str(tmp_path / "p.jsonl"))
        == ["the cat", "hello"]
    )
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:1: expected a string"):
        read_prompts_file(str(tmp_path / "bad.jsonl"))
    done: list[int] = []
    res = generate_texts(
        str(tiny_artifact),
        read_prompts_file(str(tmp_path / "p.txt")),
        TextGenOptions(max_new_tokens=3),
        on_done=lambda i, r: done.append(i),
    )
    assert done == [0, 1]
    data = results_json(res)
    r0 = data["results"][0]
    assert r0["prompt"] == "the cat" and len(r0["token_ids"]) == 3 and r0["prompt_token_ids"]
    assert set(r0["timings"]) == {"prefill_s", "ttft_s", "decode_tokens_per_s", "generated_tokens"}
    assert data["warnings"] == []


def test_chat_loop(tiny_artifact: Path) -> None:
    lines = iter(["hello", "", "again", "/exit", "never read"])
    out: list[str] = []
    turns = chat_loop(
        str(tiny_artifact), TextGenOptions(max_new_tokens=3), lambda: next(lines), out.append
    )
    assert len(turns) == 2 and isinstance(turns[1].prompt, list) and len(turns[1].prompt) == 3
    assert "".join(out).count("\n") >= 2


def test_bad_options(tiny_artifact: Path) -> None:
    with pytest.raises(InputError, match="--max-new-tokens must be >= 1"):
        TextGenerator(str(tiny_artifact), TextGenOptions(max_new_tokens=0))
    with pytest.raises(InputError, match="--top-p must be in"):
        TextGenerator(str(tiny_artifact), TextGenOptions(top_p=0.0))
    with pytest.raises(InputError, match="no prompt given"):
        generate_texts(str(tiny_artifact), [])


def test_prompt_in_chunks(tiny_module: object, tiny_artifact: Path) -> None:
    """A prompt fed in chunks after a cached prefix (batch 1 and 2) matches the reference."""
    from .helpers import ref_decoder, rel

    for batch in (1, 2):
        ids = np.random.default_rng(4).integers(3, 100, (batch, 12))
        dec, ref = open_decoder(str(tiny_artifact)), ref_decoder(tiny_module)  # type: ignore[arg-type]
        dec.reset(batch)
        ref.reset(batch)
        for a, b in ((0, 5), (5, 9), (9, 12)):
            got, want = dec.forward(ids[:, a:b]), ref.forward(ids[:, a:b])
            assert got.shape[1] == 1  # last-position logits (lower-ort-logits)
            assert rel(got, want[:, -1:]) <= 1e-4


def test_batch_forward_matches_single_rows(tiny_artifact: Path) -> None:
    """Rows of a batch (same length) decode independently."""
    dec = open_decoder(str(tiny_artifact))
    ids = np.random.default_rng(3).integers(3, 100, (2, 6))
    dec.reset(2)
    both = dec.forward(ids)
    step = dec.forward(both[:, -1].argmax(-1)[:, None])
    for b in range(2):
        dec.reset(1)
        one = dec.forward(ids[b : b + 1])
        assert np.allclose(one, both[b : b + 1], atol=1e-5)
        assert np.allclose(dec.forward(one[:, -1].argmax(-1)[:, None]), step[b : b + 1], atol=1e-5)


def test_thread_default_follows_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import llmir_core.runtime.cpu_load as rt

    monkeypatch.setattr(rt.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for busy, want in ((0.0, 2), (0.2, 2), (0.6, 1), (1.6, 1), (3.0, 1)):
        monkeypatch.setattr(rt, "busy_now", lambda b=busy: b)
        assert rt.auto_threads() == want
    assert rt.resolve_threads(3) == 3
    with pytest.raises(InputError, match="--threads must be >= 0"):
        rt.resolve_threads(-1)
