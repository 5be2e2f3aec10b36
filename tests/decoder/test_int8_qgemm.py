"""int8 builds lower projections to `ort.dynamic_quantize_matmul` (DynamicQuantizeMatMul, MLAS
QGEMM): the op's reference is what onnxruntime computes, the lowering shows each choice, a tied
lm_head keeps its MatMulNBits blocks, and `int8_matmul = nbits` keeps every weight in blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.backends import build, lower
from llmir_core.errors import InputError
from llmir_core.frontends.hf import import_hf
from llmir_core.quant import qgemm
from llmir_core.runtime.ort_decoder import open_artifact

from .helpers import parity
from .tiny import LlamaShape, make_llama_folder

PROMPT = np.random.default_rng(1).integers(3, 100, (1, 11))


def _ops(module: Any, name: str) -> list[Any]:
    return [op for op in module.main.ops if op.name == name]


@pytest.mark.parametrize("weights", ["u8", "s7"])
def test_artifact_matches_the_lowered_reference(
    weights: str, tiny_module: Any, tmp_path: Path
) -> None:
    """onnxruntime's DynamicQuantizeMatMul computes the op's reference (per-tensor uint8
    activations, exact integer sums): the artifact and the lowered module's interpreter agree to
    float rounding, not just to quantization error."""
    low = lower(tiny_module, options={"quant": "int8", "int8_matmul": f"qgemm-{weights}"})
    dq = _ops(low, "ort.dynamic_quantize_matmul")
    assert dq and {op.attrs["weights"] for op in dq} == {weights}
    assert not _ops(low, "ort.matmul_nbits")  # untied: every projection, lm_head included
    build(low, str(tmp_path / "a"))
    dec = open_artifact(str(tmp_path / "a"))
    assert parity(low, dec, PROMPT, steps=4) <= 1e-5
    assert parity(tiny_module, dec, PROMPT, steps=4) <= 0.1  # int8 against f32


def test_tied_head_keeps_shared_blocks(tmp_path: Path) -> None:
    module = import_hf(
        make_llama_folder(tmp_path / "m", LlamaShape(tie=True), tokenizer=False),
        require_tokenizer=False,
    )
    low = lower(module, options={"quant": "int8"})
    (head,) = _ops(low, "ort.matmul_nbits")
    assert head.origin == "hf:lm_head" and head.attrs["bits"] == 8
    assert _ops(low, "ort.gather_block_quantized") and _ops(low, "ort.dynamic_quantize_matmul")


def test_nbits_option_keeps_blocks(tiny_module: Any) -> None:
    low = lower(tiny_module, options={"quant": "int8", "int8_matmul": "nbits"})
    assert _ops(low, "ort.matmul_nbits") and not _ops(low, "ort.dynamic_quantize_matmul")
    low4 = lower(tiny_module, options={"quant": "int4"})  # 4-bit weights stay MatMulNBits
    assert not _ops(low4, "ort.dynamic_quantize_matmul")


def test_unknown_int8_matmul_is_an_input_error(tiny_module: Any) -> None:
    with pytest.raises(InputError, match="unknown int8_matmul 'qgemm'"):
        lower(tiny_module, options={"quant": "int8", "int8_matmul": "qgemm"})


def test_activation_quantization_rule() -> None:
    """DynamicQuantizeLinear: the range always holds 0, halves round to even, a zero tensor
    gets scale 1; weight codes stay within +-L with one scale per row."""
    q, s, z = qgemm.quantize_activations(np.array([[-1.0, 0.0, 3.0]], np.float32))
    assert s == pytest.approx(4 / 255) and z == 64 and q.tolist() == [[0, 64, 255]]
    q, s, z = qgemm.quantize_activations(np.zeros((2, 3), np.float32))
    assert (s, z) == (1.0, 0) and not q.any()
    w = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]], np.float32)
    codes, scales = qgemm.quantize_rows(w, 63)  # in f32, 0.5 / (1/63) is 31.499998
    assert codes.tolist() == [[31, -63, 16], [0, 0, 0]] and scales.tolist() == [
        np.float32(1 / 63),
        1.0,
    ]
