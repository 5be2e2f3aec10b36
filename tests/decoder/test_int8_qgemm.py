"""int8 builds lower projections to `ort.dynamic_quantize_matmul` (DynamicQuantizeMatMul, MLAS
QGEMM): the op's reference is what onnxruntime computes, the lowering shows each choice, a tied
lm_head keeps its MatMulNBits blocks, and `int8_matmul = nbits` keeps every weight in blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.hf import import_hf
from llmir_core.quant import qgemm
from llmir_core.targets import build, lower
from llmir_core.targets.onnxruntime.runner import open_decoder

from .helpers import parity
from .tiny import LlamaShape, make_llama_folder

PROMPT = np.random.default_rng(1).integers(3, 100, (1, 11))


def _ops(module: Any, name: str) -> list[Any]:
    return [op for op in module.main.ops if op.name == name]


@pytest.mark.parametrize("weights", ["s8pair", "u8"])
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
    dec = open_decoder(str(tmp_path / "a"))
    assert parity(low, dec, PROMPT, steps=4) <= 1e-5
    assert parity(tiny_module, dec, PROMPT, steps=4) <= 0.1  # int8 against f32


def test_tied_head_keeps_shared_blocks(tmp_path: Path) -> None:
    module = import_hf(
        make_llama_folder(tmp_path / "m", LlamaShape(tie=True), tokenizer=False),
        require_tokenizer=False,
    )
    low = lower(module, options={"quant": "int8", "int8_matmul": "qgemm-s8pair"})
    (head,) = _ops(low, "ort.matmul_nbits")
    assert head.origin == "hf:lm_head" and head.attrs["bits"] == 8
    assert _ops(low, "ort.gather_block_quantized") and _ops(low, "ort.dynamic_quantize_matmul")


def test_nbits_option_keeps_blocks(tiny_module: Any) -> None:
    low = lower(tiny_module, options={"quant": "int8", "int8_matmul": "nbits"})
    assert _ops(low, "ort.matmul_nbits") and not _ops(low, "ort.dynamic_quantize_matmul")
    low4 = lower(tiny_module, options={"quant": "int4"})  # 4-bit weights stay MatMulNBits
    assert not _ops(low4, "ort.dynamic_quantize_matmul")


def test_unknown_int8_matmul_is_an_input_error(tiny_module: Any) -> None:
    with pytest.raises(
        InputError,
        match="int8_matmul must be one of llmir, qgemm-s8pair, qgemm-u8, nbits, got 'qgemm'",
    ):
        lower(tiny_module, options={"quant": "int8", "int8_matmul": "qgemm"})


def test_activation_quantization_rule() -> None:
    """DynamicQuantizeLinear: the range always holds 0, halves round to even, a zero tensor
    gets scale 1."""
    q, s, z = qgemm.quantize_activations(np.array([[-1.0, 0.0, 3.0]], np.float32))
    assert s == pytest.approx(4 / 255) and z == 64 and q.tolist() == [[0, 64, 255]]
    q, s, z = qgemm.quantize_activations(np.zeros((2, 3), np.float32))
    assert (s, z) == (1.0, 0) and not q.any()


def test_pair_bounded_codes() -> None:
    """s8pair: every adjacent pair of codes sums to at most 128 in magnitude (an odd K's last
    code pairs with nothing), so a saturating 16-bit pair sum of u8 x s8 products (255 * 128)
    cannot overflow; max|w| scaling alone would allow 2 * 127."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 97)).astype(np.float32)
    w[:, :2] = [[5.0, -5.0]]  # one pair of large weights per row
    codes, scales = qgemm.quantize_rows(w, pairs=True)
    mags = np.abs(codes[:, :96].astype(np.int32)).reshape(64, 48, 2).sum(-1)
    assert mags.max() <= 128 and np.abs(codes).max() <= 127
    assert np.allclose(scales, 10.0 / 127)
    plain, ps = qgemm.quantize_rows(w)
    assert np.abs(plain[:, :2].astype(np.int32)).sum(-1).max() == 254
    assert np.allclose(ps, 5.0 / 127)
    err = np.abs(qgemm.dequantize_rows(codes, scales) - w).max()
    assert err <= scales.max() / 2 + 1e-6
    zero, zs = qgemm.quantize_rows(np.zeros((1, 4), np.float32), pairs=True)
    assert not zero.any() and zs.tolist() == [1.0]
