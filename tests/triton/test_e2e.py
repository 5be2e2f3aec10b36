"""One tiny 2-layer decoder end to end on the triton target in interpreter mode: built (lowered
module, weights in kernel layouts, AOT kernels with sha256), opened, and decoded greedily —
tokens identical to the onnxruntime build's, logits within tolerance."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import import_or_skip

import_or_skip("torch", "the triton target needs torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton target needs triton (pip install 'llmir[gpu]')")

from llmir_core.errors import InputError  # noqa: E402
from llmir_core.targets.triton.target import TARGET  # noqa: E402

from ..decoder.tiny import TINY, make_llama_folder  # noqa: E402

PROMPT = [1, 40, 17, 99, 5, 63, 2, 88, 31]
NEW = 6


@pytest.fixture(scope="module")
def tiny_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from llmir_core.frontends.hf import import_hf

    return import_hf(make_llama_folder(tmp_path_factory.mktemp("tiny") / "llama", TINY))


@pytest.fixture(scope="module")
def triton_art(tiny_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tr") / "art"
    TARGET.serialize(tiny_module, str(out), arch="sm_90")
    return out


def _greedy(dec: Any) -> tuple[list[int], list[np.ndarray]]:
    dec.reserve(len(PROMPT) + NEW)
    dec.reset(1)
    logits = dec.forward(np.asarray([PROMPT]))
    steps, toks = [logits[0, -1]], []
    for _ in range(NEW):
        toks.append(int(np.argmax(steps[-1])))
        steps.append(dec.forward(np.asarray([[toks[-1]]]))[0, -1])
    return toks, steps


@pytest.mark.slow
def test_tiny_decoder_matches_onnxruntime(
    tiny_module: Any, triton_art: Path, tmp_path: Path
) -> None:
    from llmir_core.targets.onnxruntime.runner import open_decoder
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    build_decoder(tiny_module, str(tmp_path / "ort"))
    want_toks, want = _greedy(open_decoder(str(tmp_path / "ort"), threads=1))
    dec = TARGET.open(str(triton_art))
    got_toks, got = _greedy(dec)
    assert got_toks == want_toks
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    # the prompt's full logits too, and the cache kept its rows across a reset + re-prefill
    dec.reset(1)
    full = dec.forward(np.asarray([PROMPT]))
    assert full.shape == (1, len(PROMPT), TINY.vocab)
    np.testing.assert_allclose(full[0, -1], want[0], rtol=1e-4, atol=1e-4)


def test_manifest_and_files(triton_art: Path) -> None:
    m = json.loads((triton_art / "manifest.json").read_text())
    assert m["target"] == "triton" and m["archs"] == ["sm_90"]
    assert {
        "embedding_kernel",
        "decode_attn_split_kernel",
        "prefill_attn_kernel",
        "gemv_kernel",
    } <= {e["kernel"] for e in m["kernels"]}
    for e in m["kernels"]:
        blob = (triton_art / e["cubin"]["file"]).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == e["cubin"]["sha256"]
    for name, f in m["files"].items():
        assert hashlib.sha256((triton_art / name).read_bytes()).hexdigest() == f["sha256"]
    text = (triton_art / "model.llmir").read_text()
    assert "triton.attention" in text and "llm.scaled_dot_product_attention" not in text


def test_open_without_gpu_exits_2(triton_art: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import sys; from llmir_core.targets.triton.target import TARGET\n"
        "from llmir_core.errors import InputError\n"
        "try:\n    TARGET.open(sys.argv[1])\nexcept InputError as e:\n    print(e); sys.exit(2)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(triton_art)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    assert res.returncode == 2, res.stderr
    assert "this artifact needs a CUDA GPU (none found)" in res.stdout


def test_unsupported_op_is_reported(tiny_module: Any, tmp_path: Path) -> None:
    from llmir_core.ir.parser import parse_module

    text = """module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {
  func.func @main(%input_ids: tensor<1 x ?s x i64>, %positions: tensor<1 x ?s x i64>) -> tensor<1 x ?s x 8 x f32> {
    %t = core.constant {value = dense<1.0> : tensor<8x8xf32>} : () -> tensor<8x8xf32>
    %h = llm.embedding %t, %input_ids : (tensor<8x8xf32>, tensor<1 x ?s x i64>) -> tensor<1 x ?s x 8 x f32>
    %y = core.erf %h : (tensor<1 x ?s x 8 x f32>) -> tensor<1 x ?s x 8 x f32>
    return %y : tensor<1 x ?s x 8 x f32>
  }
}"""
    with pytest.raises(InputError, match="op 'core.erf' has no triton kernel"):
        TARGET.serialize(parse_module(text, "m.llmir"), str(tmp_path / "x"), arch="sm_90")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("arch", ["gemma2", "phi3", "qwen3", "mistral", "llama-kv-int8"])
def test_architectures_match_the_reference(arch: str, tmp_path: Path) -> None:
    """gemma2 (norm offset, soft-caps, gelu_tanh, sliding window), phi3 (fused qkv, partial
    rotary), qwen3 (q/k norms), mistral (sliding window shorter than the prompt): a prefill and a
    decode step on the triton build (no AOT kernels: arch none) against the reference interpreter;
    llama-kv-int8: an int8 KV cache against the reference of the lowered module (whose
    triton.kv_append declares the int8 round trip)."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.interp import run
    from llmir_core.passes.base import PassContext

    from ..decoder.tiny import ARCH_SHAPES

    int8 = arch == "llama-kv-int8"
    module = import_hf(make_llama_folder(tmp_path / "m", ARCH_SHAPES["llama" if int8 else arch]))
    if int8:
        for p in TARGET.lowering({"kv_cache": "int8"}):
            p.run(module, PassContext())
    TARGET.serialize(module, str(tmp_path / "art"), arch="none")
    prompt = PROMPT + [3]
    feeds: dict[str, Any] = {
        "input_ids": np.asarray([prompt]),
        "positions": np.arange(len(prompt))[None],
    }
    for a in module.main.args[2:]:
        feeds[a.name] = np.zeros((1, a.type.shape[1], 0, a.type.shape[3]), np.float32)
    want = run(module, feeds)[0]
    dec = TARGET.open(str(tmp_path / "art"))
    dec.reset(1)
    if int8:
        assert {str(b.dtype) for b, _ in dec.buffers.values()} == {"torch.int8"}
    np.testing.assert_allclose(
        dec.forward(np.asarray([prompt[:-1]])), want[:, :-1], rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(
        dec.forward(np.asarray([prompt[-1:]])), want[:, -1:], rtol=1e-4, atol=1e-4
    )
