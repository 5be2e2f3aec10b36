"""f16 block scales for the weights a build quantizes for llmir's kernel (`scale_dtype = "f16"`
on `ort.matmul_nbits {kernel = "llmir"}` and on a tied lookup's `ort.gather_block_quantized`):
the choice shows in the lowered module, the artifact stores f16 scales (fewer bytes), computes
what its lowered module computes, and `nbits_scales = f32` or MLAS keep f32 scales."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.ir.printer import print_module
from llmir_core.targets import build, lower
from llmir_core.targets.onnxruntime.native import DOMAIN, unavailable_reason
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import ref_decoder, rel

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
LLMIR = {"quant": "int4", "nbits_kernel": "llmir"}


def _ops(module: Any, name: str) -> list[Any]:
    return [op for op in module.main.ops if op.name == name]


def test_lowering_records_the_scale_dtype(tiny_module: Any) -> None:
    low = lower(tiny_module, options=LLMIR)
    mm = _ops(low, "ort.matmul_nbits")
    # the scale dtype is the storage's: on the ort.pack each matmul reads (pack-ort-weights)
    packs = [op.operands[1].owner for op in mm]
    assert mm and all(p is not None and p.attrs.get("scale_dtype") == "f16" for p in packs)
    text = print_module(lower(tiny_module, options={**LLMIR, "nbits_scales": "f32"}))
    assert "scale_dtype" not in text and 'kernel = "llmir"' in text
    mlas = print_module(lower(tiny_module, options={"quant": "int4", "nbits_kernel": "mlas"}))
    assert "scale_dtype" not in mlas
    with pytest.raises(InputError, match="nbits_scales must be one of f16, f32, got 'bf16'"):
        lower(tiny_module, options={**LLMIR, "nbits_scales": "bf16"})


def test_tied_lookup_takes_the_heads_scales(tmp_path: Path) -> None:
    from llmir_core.frontends.hf import import_hf

    from .tiny import LlamaShape, make_llama_folder

    folder = make_llama_folder(tmp_path / "tied", LlamaShape(tie=True), tokenizer=False)
    module = import_hf(folder, require_tokenizer=False)
    low = lower(module, options=LLMIR)
    (gather,) = _ops(low, "ort.gather_block_quantized")
    pack = gather.operands[0].owner
    assert pack is not None and pack.attrs.get("scale_dtype") == "f16"
    build(module, str(tmp_path / "art"), "onnxruntime", options=LLMIR)
    import onnx

    model = onnx.load(str(tmp_path / "art" / "model.onnx"), load_external_data=False)
    gbq = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    head = [n for n in model.graph.node if n.domain == DOMAIN and n.input[1] == gbq[0].input[0]]
    assert head  # one copy of the blocks for the lookup and the head


def test_verifier_refuses_f16_scales_without_quantizing() -> None:
    from llmir_core.ir.parser import parse_module
    from llmir_core.verifier import verify

    text = (
        "module @m {\n  func.func @main(%x: tensor<2x64xf32>, %w: tensor<8x64xf32>) -> "
        "(tensor<2x8xf32>) {\n    %y = ort.matmul_nbits %x, %w {bits = 4, block_size = 32, "
        'scale_dtype = "f16"} : (tensor<2x64xf32>, tensor<8x64xf32>) -> tensor<2x8xf32>\n'
        "    return %y : tensor<2x8xf32>\n  }\n}\n"
    )
    errs = [d.message for d in verify(parse_module(text)) if d.severity == "error"]
    assert any('scale_dtype "f16" applies to a quantizing op' in e for e in errs), errs


def test_reference_rounds_the_scales() -> None:
    from llmir_core.dialects.registry import get_op
    from llmir_core.quant import nbits

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    a = rng.standard_normal((3, 64)).astype(np.float32)
    op = get_op("ort.matmul_nbits")
    assert op is not None and op.reference is not None
    at = op.with_defaults({"bits": 4, "block_size": 32, "quantize": "sym", "scale_dtype": "f16"})
    codes, sc, _ = nbits.quantize(w, 4, 32, True, np.dtype(np.float16))
    deq = nbits.dequantize(codes, sc, None, 4, 32, w.shape).astype(np.float64)
    assert np.allclose(op.reference([a, w], at), a.astype(np.float64) @ deq.T, atol=1e-5)
    f32 = op.reference([a, w], {**at, "scale_dtype": "f32"})
    assert not np.array_equal(op.reference([a, w], at), f32)  # the rounding is real


@needs_kernel
def test_artifact_stores_f16_scales_and_matches_its_module(
    tiny_module: Any, tmp_path: Path
) -> None:
    import onnx

    build(tiny_module, str(tmp_path / "f16"), "onnxruntime", options=LLMIR)
    opts32 = {**LLMIR, "nbits_scales": "f32"}
    build(tiny_module, str(tmp_path / "f32"), "onnxruntime", options=opts32)
    for sub, want in (("f16", onnx.TensorProto.FLOAT16), ("f32", onnx.TensorProto.FLOAT)):
        model = onnx.load(str(tmp_path / sub / "model.onnx"), load_external_data=False)
        types = {t.name: t.data_type for t in model.graph.initializer}
        ours = [
            n
            for n in model.graph.node
            if n.domain == DOMAIN and n.op_type.startswith("MatMulNBits")
        ]
        assert ours and all(types[n.input[2]] == want for n in ours), sub
    size = {
        s: sum(f.stat().st_size for f in (tmp_path / s).glob("model.onnx*")) for s in ("f16", "f32")
    }
    assert size["f16"] < size["f32"]
    # int8 activations at run time: what the lowered module (f16-rounded blocks) computes, to
    # the activation rounding, and close to the f32-scale build
    dec, b32 = open_decoder(str(tmp_path / "f16")), open_decoder(str(tmp_path / "f32"))
    ref = ref_decoder(lower(tiny_module, options=LLMIR))
    ids = np.asarray([[1, 5, 9, 2, 7, 3]])
    for d in (dec, b32, ref):
        d.reset(1)
    want = ref.forward(ids)
    assert rel(dec.forward(ids), want) <= 5e-2
    assert rel(b32.forward(ids), want) <= 5e-2
