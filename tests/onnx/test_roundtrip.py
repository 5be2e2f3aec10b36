"""Round trips: onnxruntime(original) == onnxruntime(build(import(original))) == reference(import).

Whole models generated here with onnx.helper: an MLP (external data), an attention block from the
opset-23 ops Attention / RMSNormalization / RotaryEmbedding, and a block of the com.microsoft ops
LLM exports use (MatMulNBits, GroupQueryAttention, RotaryEmbedding, (Skip)SimplifiedLayerNorm).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from llmir_core.frontends import import_model
from llmir_core.runtime.tensors import run_module
from llmir_core.targets.onnxruntime.graph import build
from llmir_core.targets.onnxruntime.session import runner_for_artifact
from tests.onnx.models import contrib, contrib_inputs, gqa_inputs, gqa_rotary, llm23, mlp, save

RTOL, ATOL = 1e-4, 1e-5


def _roundtrip(tmp_path: Path, model, inputs: dict[str, np.ndarray], external: bool = True) -> None:
    src = save(model, str(tmp_path / "model.onnx"), external=external)
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
    module = import_model(src, out_path=tmp_path / "model.llmir")
    ref = run_module(module, inputs)
    build(module, str(tmp_path / "art"))
    got = runner_for_artifact(str(tmp_path / "art")).run(inputs)
    assert set(ref) == set(want) == set(got)
    for name, w in want.items():
        np.testing.assert_allclose(ref[name], w, rtol=RTOL, atol=ATOL, err_msg=f"reference {name}")
        np.testing.assert_allclose(
            got[name], w, rtol=RTOL, atol=ATOL, err_msg=f"onnxruntime {name}"
        )


@pytest.mark.parametrize("external", [True, False], ids=["external-data", "embedded"])
def test_mlp(tmp_path: Path, external: bool) -> None:
    x = np.random.default_rng(3).standard_normal((2, 7, 64)).astype(np.float32)
    _roundtrip(tmp_path, mlp(), {"x": x}, external)


def test_opset23_attention_block(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    inputs = {
        "x": rng.standard_normal((2, 6, 32)).astype(np.float32),
        "pos": np.tile(np.arange(3, 9, dtype=np.int64), (2, 1)),
    }
    _roundtrip(tmp_path, llm23(), inputs)
    text = (tmp_path / "model.llmir").read_text()
    for op in ("llm.rms_norm", "llm.rotary_embedding", "llm.scaled_dot_product_attention"):
        assert op in text
    assert 'loc("onnx:attention")' in text


@pytest.mark.parametrize(
    "batch,seq,past",
    [(2, 5, 0), (1, 4, 3), (2, 1, 3)],
    ids=["prompt", "continued-prefill", "decode"],
)
def test_contrib_block(tmp_path: Path, batch: int, seq: int, past: int) -> None:
    _roundtrip(tmp_path, contrib(), contrib_inputs(batch=batch, seq=seq, past=past))
    text = (tmp_path / "model.llmir").read_text()
    assert "llm.quantized_matmul" in text and "!quant<nbits, bits=4, block=16" in text
    built = (tmp_path / "art" / "model.onnx").read_bytes()
    assert b"MatMulNBits" in built and b"Attention" in built


@pytest.mark.parametrize(
    "batch,seq,past",
    [(2, 5, 0), (1, 3, 4), (2, 1, 4)],
    ids=["prompt", "continued-prefill", "decode"],
)
def test_gqa_with_rotary(tmp_path: Path, batch: int, seq: int, past: int) -> None:
    _roundtrip(tmp_path, gqa_rotary(), gqa_inputs(batch, seq, past))


@pytest.mark.parametrize("batch,seq,past", [(2, 5, 0), (2, 1, 4)], ids=["prompt", "decode"])
def test_gqa_with_packed_qkv(tmp_path: Path, batch: int, seq: int, past: int) -> None:
    inputs = gqa_inputs(batch, seq, past)
    inputs["qkv"] = np.concatenate([inputs.pop("q"), inputs.pop("k"), inputs.pop("v")], axis=-1)
    _roundtrip(tmp_path, gqa_rotary(packed=True), inputs)
    assert "core.split" in (tmp_path / "model.llmir").read_text()
