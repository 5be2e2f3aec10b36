"""`llmir eval`: perplexity over sliding windows against a direct computation from the reference
interpreter's logits, KL divergence and top-1 agreement against a reference (itself: 0 and 1;
an int4 build against f32: > 0), the JSON schema, the table, and every user-facing error."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.ir.parser import parse_file
from llmir_core.runtime.evaluate import TokenScores, evaluate
from llmir_core.runtime.scoring import (
    chosen_logprobs,
    open_model,
    token_logprobs,
    top_logprobs,
)
from tests.conftest import REPO
from tests.decoder.helpers import ref_decoder
from tests.decoder.tiny import TINY, LlamaShape, make_llama_folder

TEXT = REPO / "tests" / "data" / "northanger_abbey.txt"


@dataclass(frozen=True)
class Models:
    root: Path
    hf: Path  # the Hugging Face folder (no BOS added by its tokenizer)
    llmir: Path  # its import
    f32: Path  # built with --logits all
    int4: Path  # --quant int4 --logits all
    last: Path  # the default build: last position's logits only
    bos_llmir: Path  # the same weights, a tokenizer that puts <|im_start|> (id 1) first
    other_vocab: Path  # a model with 160 tokens


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, [*map(str, args)], catch_exceptions=False)


def _ok(*args: str) -> Any:
    r = cli(*args)
    assert r.exit_code == 0, r.output
    return r


def _add_bos(folder: Path) -> None:
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)]
    )
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("eval")
    hf = make_llama_folder(root / "llama", TINY)
    bos = make_llama_folder(root / "llama_bos", TINY)
    _add_bos(bos)
    other = make_llama_folder(root / "llama160", LlamaShape(vocab=160))
    m = Models(
        root,
        hf,
        root / "tiny.llmir",
        root / "f32.build",
        root / "int4.build",
        root / "last.build",
        root / "bos.llmir",
        root / "other.build",
    )
    _ok("import", hf, "-o", m.llmir)
    _ok("import", bos, "-o", m.bos_llmir)
    _ok("import", other, "-o", root / "other.llmir")
    _ok("build", m.llmir, "--logits", "all", "-o", m.f32)
    _ok("build", m.llmir, "--logits", "all", "--quant", "int4", "-o", m.int4)
    _ok("build", m.llmir, "-o", m.last)
    _ok("build", root / "other.llmir", "--logits", "all", "-o", m.other_vocab)
    return m


def _text_ids(model: Any, n: int) -> list[int]:
    return model.tokenizer.encode(TEXT.read_text(), add_special_tokens=False)[:n]


def direct_nll(llmir: Path, ids: list[int], ctx: int, stride: int, bos: int | None) -> list[float]:
    """The negative log-likelihoods of the scored tokens, the way Hugging Face's "perplexity of
    fixed-length models" loop computes them, from the reference interpreter's logits."""
    dec = ref_decoder(parse_file(str(llmir)))
    span = ctx - (1 if bos is not None else 0)
    out: list[float] = []
    prev_end = 0
    for begin in range(0, len(ids), stride):
        end = min(begin + span, len(ids))
        new = end - prev_end  # the tokens this window scores
        inputs = ([bos] if bos is not None else []) + ids[begin:end]
        dec.reset(1)
        logits = dec.forward(np.array([inputs])).astype(np.float64)[0]
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        # position j predicts inputs[j + 1]; the window's last `new` targets are the new tokens
        nll = [-logp[j, inputs[j + 1]] for j in range(len(inputs) - 1)]
        out += nll[-new:] if new <= len(nll) else nll
        prev_end = end
        if end == len(ids):
            break
    return out


@pytest.mark.parametrize("with_bos", [False, True])
def test_perplexity_equals_a_direct_computation(models: Models, with_bos: bool) -> None:
    path = models.bos_llmir if with_bos else models.llmir
    model = open_model(str(path))
    ids = _text_ids(model, 150)
    assert model.adds_bos() == (1 if with_bos else None)
    seen: list[tuple[int, int]] = []
    rep = evaluate(model, ids, ctx=40, stride=15, on_window=lambda k, n: seen.append((k, n)))
    want = direct_nll(path, ids, 40, 15, 1 if with_bos else None)
    assert rep.scored_tokens == len(want) == (150 if with_bos else 149)
    assert rep.target_metrics["nll_mean"] == pytest.approx(float(np.mean(want)), rel=1e-9)
    assert rep.target_metrics["perplexity"] == pytest.approx(math.exp(np.mean(want)), rel=1e-8)
    assert seen == [(k, rep.windows) for k in range(1, rep.windows + 1)]
    assert (rep.ctx, rep.stride, rep.bos_id) == (40, 15, 1 if with_bos else None)


def test_the_artifact_gives_the_interpreters_perplexity(models: Models) -> None:
    art, ref = open_model(str(models.f32)), open_model(str(models.llmir))
    ids = _text_ids(art, 200)
    a = evaluate(art, ids, ctx=64, stride=32, reference=ref)
    assert a.target_metrics["perplexity"] == pytest.approx(
        a.reference_metrics["perplexity"], rel=1e-5
    )
    assert a.comparison is not None and a.comparison["kl_mean"] < 1e-8
    assert a.comparison["top1_agreement"] == 1.0


def test_the_bos_is_what_the_tokenizer_puts_first(models: Models) -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import processors

    from llmir_core.runtime.scoring import adds_bos
    from llmir_core.runtime.tokenizer import Tokenizer

    backend = Backend.from_file(str(models.hf / "tokenizer.json"))
    assert adds_bos(Tokenizer(backend, bos_id=1)) is None  # a BOS id the tokenizer does not add
    for single, bos in (("<|im_start|> $A", 1), ("<|im_start|> $A <|im_end|>", 1), ("$A <|im_end|>", None)):  # fmt: skip
        backend.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[("<|im_start|>", 1), ("<|im_end|>", 2)]
        )
        assert adds_bos(Tokenizer(backend)) == bos, single


def test_a_llmir_target_can_run_built_for_onnxruntime(models: Models) -> None:
    args = ("--text", TEXT, "--max-tokens", 200, "--ctx", 64, "--against", models.f32)
    out = _eval_json(models.llmir, "--backend", "onnxruntime", *args)
    assert out["target"]["runtime"] == "onnxruntime"  # a temporary --logits all build
    assert out["comparison"]["kl_mean"] < 1e-9 and out["comparison"]["top1_agreement"] == 1.0


@pytest.mark.parametrize("spread", [3.0, 1e-3])  # far apart, and as close as two builds
def test_kl_is_the_textbook_formula(spread: float) -> None:
    rng = np.random.default_rng(3)
    tgt = (rng.standard_normal((70, 5000)) * 3).astype(np.float32)
    ref = (tgt + rng.standard_normal((70, 5000)) * spread).astype(np.float32)
    targets = rng.integers(0, 5000, 70)
    s = TokenScores()
    s.add(tgt, ref, targets)  # 70 rows: three chunks of ROW_CHUNK = 32
    t64, r64 = tgt.astype(np.float64), ref.astype(np.float64)
    p = np.exp(r64) / np.exp(r64).sum(-1, keepdims=True)
    q = np.exp(t64) / np.exp(t64).sum(-1, keepdims=True)
    kl = (p * np.log(p / q)).sum(-1)
    assert kl.min() > (0.5 if spread > 1 else 1e-7)
    # float64 throughout: a KL of 1e-7 comes out to 7 digits, not float32's noise
    np.testing.assert_allclose(np.concatenate(s.kl), kl, rtol=1e-7)
    np.testing.assert_array_equal(np.concatenate(s.agree), p.argmax(-1) == q.argmax(-1))
    lq, lp = np.log(q[np.arange(70), targets]), np.log(p[np.arange(70), targets])
    np.testing.assert_allclose(np.concatenate(s.target), lq, rtol=1e-12)
    np.testing.assert_allclose(np.concatenate(s.reference), lp, rtol=1e-12)


KEYS = {"schema_version", "kind", "ok", "text", "target", "reference", "comparison",
        "text_tokens", "scored_tokens", "windows", "ctx", "stride", "bos_id", "seconds"}  # fmt: skip
METRICS = {"path", "runtime", "perplexity", "nll_mean", "nll_stderr"}
COMPARISON = {"perplexity_diff", "perplexity_ratio", "kl_mean", "kl_stderr", "kl_p99", "kl_max",
              "top1_agreement", "logprob_diff_mean"}  # fmt: skip


def _eval_json(*args: str) -> dict[str, Any]:
    r = _ok("eval", *args, "--format", "json")
    return dict(json.loads(r.stdout))


def test_a_build_against_itself_has_zero_kl(models: Models) -> None:
    out = _eval_json(
        models.f32, "--text", TEXT, "--max-tokens", 300, "--ctx", 64, "--against", models.f32
    )
    assert set(out) == KEYS and out["kind"] == "eval" and out["schema_version"] == 1
    assert set(out["target"]) == METRICS and set(out["reference"]) == METRICS
    assert set(out["comparison"]) == COMPARISON
    c = out["comparison"]
    assert c["kl_mean"] == 0.0 and c["kl_p99"] == 0.0 and c["kl_max"] == 0.0
    assert c["top1_agreement"] == 1.0 and c["perplexity_diff"] == 0.0
    assert c["logprob_diff_mean"] == 0.0 and c["perplexity_ratio"] == 1.0
    assert (out["text_tokens"], out["scored_tokens"], out["ctx"], out["stride"]) == (
        300,
        299,
        64,
        32,
    )
    assert out["windows"] == 9 and out["bos_id"] is None
    assert out["target"]["runtime"] == out["reference"]["runtime"] == "onnxruntime"


def test_int4_against_f32_has_positive_kl(models: Models) -> None:
    out = _eval_json(
        models.int4, "--text", TEXT, "--max-tokens", 400, "--ctx", 128, "--against", models.f32
    )
    c = out["comparison"]
    assert 1e-3 < c["kl_mean"] <= c["kl_p99"] <= c["kl_max"]
    assert 0.3 < c["top1_agreement"] < 1.0
    assert c["perplexity_diff"] == pytest.approx(
        out["target"]["perplexity"] - out["reference"]["perplexity"]
    )
    assert c["logprob_diff_mean"] == pytest.approx(
        out["reference"]["nll_mean"] - out["target"]["nll_mean"]
    )
    alone = _eval_json(models.int4, "--text", TEXT, "--max-tokens", 400, "--ctx", 128)
    assert alone["reference"] is None and alone["comparison"] is None
    assert alone["target"]["perplexity"] == out["target"]["perplexity"]


def test_the_table(models: Models) -> None:
    r = _ok(
        "eval",
        models.int4,
        "--text",
        TEXT,
        "--max-tokens",
        200,
        "--ctx",
        64,
        "--against",
        models.llmir,
    )
    assert "\x1b[" not in r.stdout and r.stderr == ""  # no colour, no progress bar in a pipe
    for label in ("perplexity", "reference perplexity", "mean KL divergence", "99th percentile KL",
                  "top-1 agreement", "mean log-prob difference", "199 tokens scored in 6 windows"):  # fmt: skip
        assert label in r.stdout, label
    assert "(reference)" in r.stdout  # the .llmir reference ran on the interpreter


def test_the_progress_bar_is_drawn_on_a_terminal_only() -> None:
    from io import StringIO

    from rich.console import Console

    from llmir_cli._render import make_ctx
    from llmir_cli.commands.eval import _progress

    ctx, buf = make_ctx(), StringIO()
    ctx.__dict__["err"] = Console(file=buf, force_terminal=True, width=100)  # a terminal
    with _progress(ctx) as update:
        assert update is not None
        update(1, 3)
        update(3, 3)
    assert "windows" in buf.getvalue() and "3/3" in buf.getvalue()
    quiet = make_ctx(quiet=True)
    quiet.__dict__["err"] = Console(file=StringIO(), force_terminal=True)
    with _progress(quiet) as none:
        assert none is None
    with _progress(make_ctx()) as piped:  # stderr is not a terminal under pytest
        assert piped is None


def test_a_last_position_build_scores_step_by_step_for_the_scoring_api(models: Models) -> None:
    from llmir_core.targets.onnxruntime.runner import open_decoder

    full = open_model(str(models.f32))
    step = open_model(str(models.last), stepwise=True)
    ids = _text_ids(full, 20)
    a, b = token_logprobs(full, ids, 5), token_logprobs(step, ids, 5)
    assert a.shape == b.shape == (15, TINY.vocab)
    np.testing.assert_allclose(a, b, atol=1e-4)
    # a path, or a decoder the caller opened, goes as is (serve's echo has an open decoder)
    np.testing.assert_allclose(token_logprobs(str(models.last), ids, 5), b, atol=1e-6)
    np.testing.assert_allclose(token_logprobs(open_decoder(str(models.last)), ids, 5), b, atol=1e-6)
    with pytest.raises(InputError, match="the last position's logits only"):
        open_model(str(models.last)).scorer.logits(ids)
    lp = chosen_logprobs(a, ids, 5)
    assert lp.shape == (14,) and lp[0] == a[0, ids[6]]
    top = top_logprobs(a[0], 3)
    assert [i for i, _ in top] == list(np.argsort(-a[0])[:3]) and top[0][1] == a[0].max()


def test_against_a_hugging_face_folder_run_by_transformers(models: Models) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    out = _eval_json(
        models.llmir, "--text", TEXT, "--max-tokens", 120, "--ctx", 64, "--against", models.hf
    )
    assert out["reference"]["runtime"] == "transformers"
    assert out["comparison"]["kl_mean"] < 1e-6 and out["comparison"]["top1_agreement"] == 1.0


def _gguf_of(folder: Path, out: Path) -> Path:
    """The HF folder's weights (F32) and its tokenizer's vocabulary as a GGUF file."""
    from safetensors.numpy import load_file

    from tests.llm.gguf_convert import write_gguf

    tj = json.loads((folder / "tokenizer.json").read_text())
    vocab = {**tj["model"]["vocab"], **{a["content"]: a["id"] for a in tj["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {a["id"] for a in tj["added_tokens"]}
    tok = {
        "model": "gpt2",
        "pre": "gpt-2",
        "tokens": tokens,
        "token_type": [3 if i in special else 1 for i in range(len(tokens))],
        # (a merge with a space cannot be written as GGUF's "a b"; llama.cpp is given ids only)
        "merges": [" ".join(m) for m in tj["model"]["merges"] if " " not in "".join(m)],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "add_bos_token": False,
    }
    write_gguf(folder, load_file(str(folder / "model.safetensors")), out, "F32", tokenizer=tok)
    return out


def test_against_a_gguf_run_by_llama_cpp(models: Models) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    gguf = _gguf_of(models.hf, models.root / "tiny.gguf")
    ref = open_model(str(gguf))
    assert ref.tokenizer is not None  # so the vocabularies were compared, not only the widths
    out = _eval_json(
        models.f32, "--text", TEXT, "--max-tokens", 300, "--ctx", 64, "--against", gguf
    )
    assert out["reference"]["runtime"] == "llama.cpp"
    c = out["comparison"]
    assert c["kl_mean"] < 1e-6 and c["top1_agreement"] == 1.0  # the same f32 weights
    bad = models.root / "bad.gguf"
    bad.write_bytes(b"GGUF but not a model")
    assert _fails(str(models.f32), "--text", TEXT, "--against", bad) == (
        f"error: {bad}: llama.cpp cannot load the model: Failed to load model from file: {bad}"
    )


# -- errors: one line, exit 2, no traceback --------------------------------------------------------


def _fails(*args: str) -> str:
    r = cli("eval", *args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_errors(models: Models, tmp_path: Path) -> None:
    empty, one = tmp_path / "empty.txt", tmp_path / "one.txt"
    empty.write_text(" \n\n")
    one.write_text("a")
    f32 = str(models.f32)
    assert (
        _fails(f32, "--text", tmp_path / "nope.txt")
        == f"error: {tmp_path / 'nope.txt'}: no such file"
    )
    assert _fails(f32, "--text", empty) == f"error: {empty}: the text is empty"
    assert (
        _fails(f32, "--text", one) == "error: the text has 1 token(s); perplexity needs at least 2"
    )
    assert (
        _fails(f32, "--text", TEXT, "--ctx", 1) == "error: --ctx must be at least 2 tokens, got 1"
    )
    assert _fails(f32, "--text", TEXT, "--ctx", 64, "--stride", 64) == (
        "error: --stride must be between 1 and 63 (--ctx minus 1), got 64"
    )
    assert _fails(f32, "--text", TEXT, "--stride", 0) == (
        "error: --stride must be between 1 and 255 (--ctx minus 1), got 0"  # ctx: the model's 256
    )
    assert _fails(f32, "--text", TEXT, "--ctx", 300) == (
        "error: --ctx 300 exceeds the model's context of 256 tokens"
    )
    assert (
        _fails(f32, "--text", TEXT, "--max-tokens", 1)
        == "error: --max-tokens must be at least 2, got 1"
    )
    assert _fails(f32, "--text", TEXT, "--against", models.other_vocab) == (
        f"error: {f32} and {models.other_vocab} have different vocabularies (128 tokens vs 160)"
    )
    assert _fails(str(models.last), "--text", TEXT) == (
        f"error: {models.last}: the artifact computes the last position's logits only, and "
        "scoring needs every position's"
    )
    assert _fails(str(models.root / "missing.build"), "--text", TEXT) == (
        f"error: {models.root / 'missing.build'}: no such file or folder"
    )
    assert _fails(f32, "--text", TEXT, "--against", TEXT) == (
        f"error: {TEXT}: not a model llmir can score"
    )
    assert _fails(f32, "--text", TEXT, "--backend", "reference") == (
        "error: --backend applies to a .llmir TARGET only"
    )


def test_a_gguf_reference_needs_llama_cpp_python(
    models: Models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    with pytest.raises(InputError) as err:
        open_model(str(gguf))
    assert "(package llama-cpp-python), which are not installed" in err.value.message
    assert err.value.hint is not None and "pip install llama-cpp-python" in err.value.hint


def test_the_shipped_text_is_named_and_public_domain() -> None:
    data = TEXT.read_bytes()
    assert 300_000 < len(data) < 450_000 and data.isascii()
    assert b"Gutenberg" not in data and b"NORTHANGER ABBEY" in data[:100]
    readme = (TEXT.parent / "northanger_abbey.README.md").read_text()
    assert "public domain" in readme and "Project Gutenberg" in readme
