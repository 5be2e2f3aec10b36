"""Model metadata a user or a broken download can set to anything: config.json and GGUF fields
are checked against the weight files before anything is sized from them (no hang, no internal
error), with one line naming the file and the field (exit 2), and nothing written."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.inputs import gguf_edit as ge
from tests.inputs.helpers import invoke, listing, rejected

HF_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "layers as a word": (
        {"num_hidden_layers": "two"},
        "field 'num_hidden_layers' must be a whole number, got 'two'",
    ),
    "layers 1e9 (a hang before)": (
        {"num_hidden_layers": 1e9},
        "field 'num_hidden_layers' is 1000000000, but the weights in model.safetensors cover 2 layer(s)",
    ),
    "layers 2.5": (
        {"num_hidden_layers": 2.5},
        "field 'num_hidden_layers' must be a whole number, got 2.5",
    ),
    "negative eps": ({"rms_norm_eps": -1}, "field 'rms_norm_eps' is -1, must be at least 0"),
    "eps NaN": ({"rms_norm_eps": float("nan")}, "field 'rms_norm_eps' must be a finite number"),
    "zero heads": (
        {"num_attention_heads": 0},
        "field 'num_attention_heads' is 0, must be at least 1",
    ),
    "huge hidden": (
        {"hidden_size": 10**12},
        "field 'hidden_size' is 1000000000000, larger than any tensor dimension",
    ),
    "head_dim as bool": ({"head_dim": True}, "field 'head_dim' must be a whole number, got True"),
    "context -1": (
        {"max_position_embeddings": -1},
        "field 'max_position_embeddings' is -1, must be at least 1",
    ),
    "rope_theta 0": ({"rope_theta": 0}, "field 'rope_theta' is 0, must be greater than 0"),
    "rope_scaling a list": ({"rope_scaling": [1]}, "field 'rope_scaling' must be an object"),
    "rope factor a string": (
        {"rope_scaling": {"rope_type": "linear", "factor": "2"}},
        "field 'rope_scaling.factor' must be a number",
    ),
}


def _hf(src: Path, dst: Path, **over: Any) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(over)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("case", list(HF_CASES))
def test_bad_hf_config(llama_dir: Path, tmp_path: Path, case: str) -> None:
    over, message = HF_CASES[case]
    folder = _hf(llama_dir, tmp_path / "m", **over)
    before = listing(tmp_path)
    t0 = time.perf_counter()
    code, out, err = invoke("import", str(folder), "-o", str(tmp_path / "m.llmir"))
    line = rejected(code, err, expect=2, names=f"{folder / 'config.json'}: ")
    assert message in line
    assert time.perf_counter() - t0 < 10
    assert listing(tmp_path) == before


def _gguf(src: Path, dst: Path, edit: Any) -> Path:
    g = ge.read(src)
    edit(g)
    return ge.write(g, dst)


def _set(key: str, t: int, v: Any) -> Any:
    return lambda g: g.set(key, t, v)


def _unaligned(g: ge.GGUF) -> None:
    g.tensors[1].offset += 4


GGUF_CASES: dict[str, tuple[Any, str]] = {
    "head_count 0": (
        _set("llama.attention.head_count", ge.U32, 0),
        "metadata field 'llama.attention.head_count' is 0, must be at least 1",
    ),
    "eps as a string": (
        _set("llama.attention.layer_norm_rms_epsilon", ge.STRING, "1e-5"),
        "metadata field 'llama.attention.layer_norm_rms_epsilon' must be a number, got '1e-5'",
    ),
    "absurd block_count": (
        _set("llama.block_count", ge.U64, 10**15),
        "metadata field 'llama.block_count' is 1000000000000000, but the weights in the file cover 2 layer(s)",
    ),
    "context_length -1": (
        _set("llama.context_length", ge.I32, -1),
        "metadata field 'llama.context_length' is -1, must be at least 1",
    ),
    "tokens stored as U32": (
        _set("tokenizer.ggml.tokens", ge.ARRAY, (ge.U32, list(range(128)))),
        "metadata field 'tokenizer.ggml.tokens' must be an array of strings",
    ),
    "eos id past the vocabulary": (
        _set("tokenizer.ggml.eos_token_id", ge.U32, 5000),
        "metadata field 'tokenizer.ggml.eos_token_id' is 5000, more than 127",
    ),
    "offset not aligned": (_unaligned, "not on the file's 32-byte alignment (general.alignment)"),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_bad_gguf_metadata(llama_gguf: Path, tmp_path: Path, case: str) -> None:
    edit, message = GGUF_CASES[case]
    f = _gguf(llama_gguf, tmp_path / "m.gguf", edit)
    code, out, err = invoke("import", str(f), "-o", str(tmp_path / "m.llmir"))
    line = rejected(code, err, expect=2, names=str(f))
    assert message in line
    assert listing(tmp_path) == {"m.gguf"}


def test_gguf_codec_round_trips(llama_gguf: Path, tmp_path: Path) -> None:
    """The test codec writes back the same bytes, so each case above differs only by its edit."""
    assert ge.encode(ge.read(llama_gguf)) == llama_gguf.read_bytes()
    code, out, err = invoke(
        "import",
        str(_gguf(llama_gguf, tmp_path / "m.gguf", lambda g: None)),
        "-o",
        str(tmp_path / "m.llmir"),
    )
    assert code == 0, err


TOKENIZER_CASES = {
    "empty": (b"", "tokenizer.json: empty file"),
    "not JSON": (b'{"model": {', "tokenizer.json:1:12: not valid JSON"),
    "not UTF-8": (b'{"model": "\xff"}', "tokenizer.json:1:12: not UTF-8 text (byte 0xff)"),
    "a list": (b"[]", "tokenizer.json: must be a JSON object, got list"),
    "model not an object": (b'{"model": 3}', "tokenizer.json: field 'model' must be an object"),
    "unloadable": (
        b'{"model": {"type": "BPE", "vocab": 7}}',
        "tokenizer.json: not a valid tokenizer.json",
    ),
}


@pytest.mark.parametrize("case", list(TOKENIZER_CASES))
def test_bad_tokenizer_json_is_refused_at_import(
    llama_dir: Path, tmp_path: Path, case: str
) -> None:
    data, message = TOKENIZER_CASES[case]
    folder = _hf(llama_dir, tmp_path / "m")
    (folder / "tokenizer.json").write_bytes(data)
    code, out, err = invoke("import", str(folder), "-o", str(tmp_path / "m.llmir"))
    line = rejected(code, err, expect=2, names=str(folder))
    assert message in line
    assert not (tmp_path / "m.llmir").exists()
    code, out, err = invoke(
        "import", str(folder), "-o", str(tmp_path / "m.llmir"), "--no-tokenizer"
    )
    assert code == 0, err


@pytest.mark.parametrize(
    "file, key",
    [
        ("config.json", "torch_dtype"),
        ("generation_config.json", "temperature"),
        ("tokenizer_config.json", "chat_template"),
    ],
)
def test_lone_surrogate_in_model_json(llama_dir: Path, tmp_path: Path, file: str, key: str) -> None:
    """A lone "\\ud800" decodes to a string no file can hold: refused where it is read, not when
    the .llmir is written."""
    folder = _hf(llama_dir, tmp_path / "m")
    data = json.loads((folder / file).read_text())
    data[key] = "ok \ud800"
    (folder / file).write_text(json.dumps(data))
    code, out, err = invoke("import", str(folder), "-o", str(tmp_path / "m.llmir"))
    line = rejected(code, err, expect=2, names=f"{folder / file}:1:")
    assert "a lone UTF-16 surrogate escape" in line
    assert not (tmp_path / "m.llmir").exists()


def test_tokenizer_that_panics_the_tokenizers_library(llama_dir: Path, tmp_path: Path) -> None:
    """A BPE continuing_subword_prefix longer than the merged pieces makes the `tokenizers`
    library panic (a Rust panic is a BaseException, not an Exception): still one clean line."""
    pytest.importorskip("tokenizers", reason="the check loads the file with tokenizers")
    folder = _hf(llama_dir, tmp_path / "m")
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["model"]["continuing_subword_prefix"] = "None"
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    code, out, err = invoke("import", str(folder), "-o", str(tmp_path / "m.llmir"))
    line = rejected(
        code, err, expect=2, names=f"{folder / 'tokenizer.json'}: not a valid tokenizer.json"
    )
    assert not (tmp_path / "m.llmir").exists(), line
