"""lower-ort-embedding and `ort.gather_block_quantized`: embeddings in block-stored tables keep
their blocks in the artifact (GatherBlockQuantized), exactly where the blocks are the model's
own (GGUF), with the error reported where the build rounds them (--quant); nbits scales that are
f16 values are stored as f16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmir_core.dialects.registry import get_op
from llmir_core.frontends.hf import import_hf
from llmir_core.targets.onnxruntime.dialect import fake_quant
from llmir_core.targets.onnxruntime.runner import open_decoder
from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

from .helpers import parity, quantize_weights
from .tiny import LlamaShape, make_llama_folder

PROMPT = np.random.default_rng(1).integers(3, 100, (1, 11))


def _gbq() -> object:
    od = get_op("ort.gather_block_quantized")
    assert od is not None
    return od


def test_reference_is_the_rows_exact_or_rounded() -> None:
    od = _gbq()
    rng = np.random.default_rng(0)
    table = rng.standard_normal((10, 64)).astype(np.float32)
    ids = np.array([[3, 0, 9]], np.int64)
    at = od.with_defaults({"bits": 4, "block_size": 32})  # type: ignore[attr-defined]
    exact = od.reference([table, ids], at)  # type: ignore[attr-defined]
    assert np.array_equal(exact, table[ids])
    at = od.with_defaults({"bits": 4, "block_size": 32, "quantize": "sym"})  # type: ignore[attr-defined]
    rounded = od.reference([table, ids], at)  # type: ignore[attr-defined]
    assert np.array_equal(rounded, fake_quant(table, 4, 32, "sym")[ids])
    assert 0 < np.abs(rounded - exact).max() < np.abs(table).max() / 7


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"bits": 3, "block_size": 32}, "bits must be 4 or 8"),
        ({"bits": 4, "block_size": 24}, "power of two"),
        ({"bits": 4, "block_size": 128}, "not a multiple of block_size"),
    ],
)
def test_bad_attributes_are_named(attrs: dict[str, int], message: str) -> None:
    from llmir_core.ir.parser import parse_module

    text = (
        'module @m attributes {llmir.dialects = ["core", "ort"], llmir.version = "0.1"} {\n'
        "  func.func @main(%t: tensor<16x64xf32>, %i: tensor<?s x i64>) -> tensor<?s x 64 x f32> {\n"
        f"    %h = ort.gather_block_quantized %t, %i {{bits = {attrs['bits']}, block_size = "
        f"{attrs['block_size']}}} : (tensor<16x64xf32>, tensor<?s x i64>) -> tensor<?s x 64 x f32>\n"
        "    return %h : tensor<?s x 64 x f32>\n  }\n}\n"
    )
    from llmir_core.verifier import verify

    diags = verify(parse_module(text, "m.llmir"))
    assert any(message in d.message for d in diags), [d.message for d in diags]


def test_quantizing_lookup_decomposes_to_the_lookup_in_the_quantized_table() -> None:
    """Its meaning (what translation validation expands it to): llm.embedding of
    llm.dequantize(llm.quantize(table)), equal to its reference."""
    from llmir_core.builder import Builder
    from llmir_core.interp import Interpreter
    from llmir_core.ir.core import Function, Module, Value
    from llmir_core.ir.types import DType, TensorType

    od = get_op("ort.gather_block_quantized")
    assert od is not None and od.decompose is not None
    at = od.with_defaults({"bits": 4, "block_size": 32, "quantize": "sym", "scale_dtype": "f16"})
    args = [Value("t", TensorType((10, 64), DType.f32)), Value("i", TensorType((2, 3), DType.i64))]
    fn = Function("f", args)
    fn.outputs = od.decompose(Builder(fn), args, at)
    assert [o.name for o in fn.ops] == ["llm.quantize", "llm.dequantize", "llm.embedding"]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((10, 64)).astype(np.float32), rng.integers(0, 10, (2, 3))]
    got = Interpreter(Module()).run_function(fn, xs, {})[0]
    np.testing.assert_array_equal(got, od.reference(xs, at))


@pytest.mark.parametrize("scheme", ["q4_0", "q8_0"])
def test_untied_gguf_table_keeps_its_blocks(scheme: str, tmp_path: Path) -> None:
    """An untied GGUF-quantized embedding is looked up in its blocks (not written as f32), its
    f16 scales stored as f16, and the logits match the reference."""
    import onnx

    module = import_hf(
        make_llama_folder(tmp_path / "m", LlamaShape(), tokenizer=False), require_tokenizer=False
    )
    quantize_weights(
        module, tmp_path / "blob.bin", lambda name: scheme if "embed" in name else None
    )
    man = build_decoder(module, str(tmp_path / "a"), accuracy_level=1)
    (emb,) = man["decoder"]["quant"]["embedding"]
    assert emb["quantize"] == "none" and not emb["shared_with_lm_head"]
    assert "max_abs_error" not in emb  # exact: nothing to report
    m = onnx.load(str(tmp_path / "a" / "model.onnx"), load_external_data=False)
    gbq = next(n for n in m.graph.node if n.op_type == "GatherBlockQuantized")
    assert "input_ids" in gbq.input
    assert not [n for n in m.graph.node if n.op_type == "Gather" and "input_ids" in n.input]
    inits = {t.name: t for t in m.graph.initializer}
    assert inits[gbq.input[0]].dims == [128, 2, 32 * (4 if scheme == "q4_0" else 8) // 8]
    half = [t for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert len(half) == 1 and list(half[0].dims) == [128, 2]  # GGUF's f16 scales, as stored
    assert parity(module, open_decoder(str(tmp_path / "a")), PROMPT, steps=3) <= 1e-4
