"""llmir's block-quantized matmul (`ort.matmul_nbits {kernel = "llmir"}`: ai.llmir MatMulNBitsQ4 /
MatMulNBitsQ8 in llmir_core/targets/onnxruntime/native/matmul_nbits.c): the compiled kernel against numpy
(int8 activations per 32-block, exactly emulated; f32 for the prefill of 8-bit blocks) for 4 and 8 bits, f32 and f16 scales, with and without zero points, odd block counts; `--quant int4/int8`
builds that use it compute what onnxruntime's MatMulNBits builds compute; GGUF q4_0 / q8_0
blocks run on it as stored (f16 scales, no Cast); the choice shows in the lowered module, and
without the capability the lowering keeps MatMulNBits. Tests that run the kernel are skipped
where the library cannot be built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.ir.printer import print_module
from llmir_core.passes.base import clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.quant import nbits
from llmir_core.targets import build, get_target
from llmir_core.targets.onnxruntime.native import (
    DOMAIN,
    NBITS_OP_NAMES,
    register,
    unavailable_reason,
)
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import assert_dot_close, edge_rows, greedy, rel

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
PROMPT = np.array([[1, 5, 9, 2, 7, 3]])
F32 = np.float32


def _session(bits: int, n: int, k: int, f16: bool, zp: bool) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    ins = ["x", "b", "s"] + (["z"] if zp else [])
    node = helper.make_node(NBITS_OP_NAMES[bits], ins, ["y"], domain=DOMAIN)
    vi = helper.make_tensor_value_info
    inputs = [
        vi("x", TensorProto.FLOAT, None),
        vi("b", TensorProto.UINT8, [n, k // 32, 4 * bits]),
        vi("s", TensorProto.FLOAT16 if f16 else TensorProto.FLOAT, [n * (k // 32)]),
    ] + ([vi("z", TensorProto.UINT8, None)] if zp else [])
    g = helper.make_graph([node], "nb", inputs, [vi("y", TensorProto.FLOAT, None)])
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _int8_rows(x: np.ndarray) -> np.ndarray:
    """x as the kernel sees it at decode: int8 codes per 32-block, q = rint(x * (127 / amax)) in
    f32 (round half to even), times amax / 127."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(xb * inv)
    return (q.astype(np.float64) * (amax / F32(127)).astype(np.float64)).reshape(m, k)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("f16,zp", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize(
    "n,k", [(37, 32), (64, 96), (130, 576), (19, 1056)]
)  # 1056: one row a pass
def test_kernel_matches_numpy(bits: int, f16: bool, zp: bool, n: int, k: int) -> None:
    rng = np.random.default_rng(n * k + bits)
    w = rng.standard_normal((n, k)).astype(F32)
    codes, sc, z = nbits.quantize(w, bits, 32, not zp, np.dtype(np.float16 if f16 else F32))
    deq = nbits.dequantize(codes, sc, z, bits, 32, (n, k)).astype(np.float64)
    feeds = {"b": codes.reshape(n, k // 32, -1), "s": sc.reshape(-1)}
    if zp:
        feeds["z"] = z.reshape(-1)  # type: ignore[union-attr]
    sess = _session(bits, n, k, f16, zp)
    for m in (1, 2, 5, 128):  # decode rows (GEMV) and prefill rows (GEMM)
        x = edge_rows(rng.standard_normal((m, k)).astype(F32))  # zero, tiny, huge rows
        got = sess.run(None, {"x": x, **feeds})[0]
        assert got.shape == (m, n) and got.dtype == F32
        exact = x.astype(np.float64) @ deq.T
        # int8 activations but for the prefill (M > 16) of 8-bit blocks (f32 panels)
        int8 = m <= 16 or bits == 4
        xs = _int8_rows(x) if int8 else x.astype(np.float64)
        # only the f32 summation order differs from the kernel's own numerics, element by element
        assert_dot_close(got, xs @ deq.T, np.abs(xs) @ np.abs(deq).T, 5e-7 * np.sqrt(k))
        # and int8 activations stay within their quantization error of the exact product
        assert rel(got, exact) <= (3e-2 if int8 else 1e-5)


@needs_kernel
def test_kernel_takes_batched_rows() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((70, 64)).astype(F32)
    codes, sc, _ = nbits.quantize(w, 4, 32, True, np.dtype(F32))
    feeds = {"b": codes.reshape(70, 2, 16), "s": sc.reshape(-1)}
    x = rng.standard_normal((2, 9, 64)).astype(F32)  # [batch, seq, K]: M = 18
    y = _session(4, 70, 64, False, False).run(None, {"x": x, **feeds})[0]
    deq = nbits.dequantize(codes, sc, None, 4, 32, (70, 64))
    assert y.shape == (2, 9, 70)
    want = (_int8_rows(x.reshape(18, 64)) @ deq.T.astype(np.float64)).reshape(2, 9, 70)
    assert rel(y, want) <= 1e-6


@needs_kernel
def test_kernel_refuses_mismatched_inputs() -> None:
    rng = np.random.default_rng(4)
    codes, sc, _ = nbits.quantize(
        rng.standard_normal((8, 64)).astype(F32), 4, 32, True, np.dtype(F32)
    )
    sess = _session(4, 8, 64, False, False)
    feeds = {"b": codes.reshape(8, 2, 16), "s": sc.reshape(-1)}
    with pytest.raises(
        Exception, match=r"X \[\.\.\., K\] and B \[N, K/32, 32\*bits/8\] do not match"
    ):
        sess.run(None, {"x": np.zeros((1, 48), F32), **feeds})
    assert sess.run(None, {"x": np.zeros((1, 64), F32), **feeds})[0].shape == (1, 8)


def _lowered(module: Any, **options: Any) -> str:
    # attention keeps onnxruntime's op here: its kernel has its own tests (test_attention_kernel)
    lowering = get_target("onnxruntime").lowering({"attention_kernel": "onnxruntime", **options})
    return print_module(run_pipeline(clone_module(module), lowering).module)


def _op_lines(text: str, op: str) -> str:
    """The lines of a printed module that hold `op` (other ops carry `kernel` attributes too)."""
    return "\n".join(x for x in text.splitlines() if op in x)


@needs_kernel
@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_build_matches_matmulnbits(quant: str, tiny_module: Any, tmp_path: Path) -> None:
    opts: dict[str, Any] = {"quant": quant}
    if quant == "int8":
        opts["int8_matmul"] = "nbits"  # blocks, not per-channel QGEMM
    text = _lowered(tiny_module, **opts)
    mm = _op_lines(text, "ort.matmul_nbits")
    assert mm.count('kernel = "llmir"') == mm.count("ort.matmul_nbits") > 0
    build(tiny_module, str(tmp_path / "llmir"), "onnxruntime", options=opts)
    build(
        tiny_module,
        str(tmp_path / "mlas"),
        "onnxruntime",
        options={**opts, "nbits_kernel": "mlas", "attention_kernel": "onnxruntime"},
    )
    man = json.loads((tmp_path / "llmir" / "manifest.json").read_text())
    assert man["custom_ops"] == ["llmir_ops"] and man["opset"][DOMAIN] == 1
    assert json.loads((tmp_path / "mlas" / "manifest.json").read_text())["custom_ops"] == []
    a, b = open_decoder(str(tmp_path / "llmir")), open_decoder(str(tmp_path / "mlas"))
    a.reset(1)
    b.reset(1)
    # the same blocks and int8 activations (llmir's prefill: int8 for 4-bit blocks, f32 for 8-bit)
    assert rel(a.forward(PROMPT), b.forward(PROMPT)) <= 5e-2
    assert rel(a.forward(PROMPT[:, :1]), b.forward(PROMPT[:, :1])) <= 5e-2
    assert greedy(a, [1, 5, 9], 16) == greedy(b, [1, 5, 9], 16)


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_gguf_blocks_run_as_stored(qtype: str, tmp_path: Path) -> None:
    import onnx
    from safetensors.numpy import load_file

    from llmir_core.frontends.gguf import import_gguf
    from tests.decoder.helpers import ref_decoder
    from tests.decoder.tiny import LlamaShape, make_llama_folder
    from tests.llm.gguf_convert import write_gguf

    folder = make_llama_folder(tmp_path / "hf", LlamaShape(hidden=64, intermediate=96, tie=True))
    write_gguf(folder, load_file(str(folder / "model.safetensors")), tmp_path / "m.gguf", qtype)
    module = import_gguf(tmp_path / "m.gguf")
    assert 'kernel = "llmir"' in _lowered(module)
    build(module, str(tmp_path / "art"), "onnxruntime")
    model = onnx.load(str(tmp_path / "art" / "model.onnx"), load_external_data=False)
    ours = [n for n in model.graph.node if n.op_type.startswith("MatMulNBits")]
    assert ours and not [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    f16 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16}
    assert all(n.input[2] in f16 for n in ours)  # GGUF's f16 scales, read as stored
    dec = open_decoder(str(tmp_path / "art"))
    # int8 activations at decode: the reference's tokens on this tiny model
    assert greedy(dec, [1, 5, 9, 2, 7, 3], 8) == greedy(ref_decoder(module), [1, 5, 9, 2, 7, 3], 8)


def test_a_tied_table_needs_no_alias(tmp_path: Path) -> None:
    """Nothing prepacks the tied int4 table: the lookup and llmir's lm_head read one initializer."""
    from llmir_core.frontends.hf import import_hf

    from .tiny import LlamaShape, make_llama_folder

    module = import_hf(
        make_llama_folder(tmp_path / "tied", LlamaShape(tie=True), tokenizer=False),
        require_tokenizer=False,
    )
    opts = {"quant": "int4", "nbits_kernel": "llmir"}
    man = build(module, str(tmp_path / "art"), "onnxruntime", options=opts)
    assert "load_layout" not in man["decoder"]
    import onnx

    model = onnx.load(str(tmp_path / "art" / "model.onnx"), load_external_data=False)
    head = [n for n in model.graph.node if n.domain == DOMAIN and n.input[1].endswith("qweight")]
    gather = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    assert gather and any(n.input[1] == gather[0].input[0] for n in head)


@needs_kernel
def test_reimported_llmir_kernel_build(tiny_module: Any, tmp_path: Path) -> None:
    """`llmir import` of a model.onnx with ai.llmir MatMulNBitsQ4 nodes: the same blocks as
    llm.quantized_matmul (accuracy_level 4), whose rebuild takes llmir's kernel again."""
    from llmir_core.frontends.onnx import import_onnx

    build(tiny_module, str(tmp_path / "a"), "onnxruntime", options={"quant": "int4"})
    again, _ = import_onnx(str(tmp_path / "a" / "model.onnx"))
    qm = [op for op in again.main.ops if op.name == "llm.quantized_matmul"]
    assert qm and {op.attrs.get("accuracy_level") for op in qm} == {4}
    assert _op_lines(_lowered(again), "ort.matmul_nbits").count('kernel = "llmir"') == len(qm)


def test_for_portable_x86_64_matmulnbits_is_kept(tiny_module: Any, tmp_path: Path) -> None:
    text = _lowered(tiny_module, quant="int4", cpu="x86-64")
    assert "ort.matmul_nbits" in text and "kernel =" not in _op_lines(text, "ort.matmul_nbits")
    with pytest.raises(InputError, match="nbits_kernel=llmir needs llmir's kernels, and cpu=x86"):
        _lowered(tiny_module, quant="int4", cpu="x86-64", nbits_kernel="llmir")
    opts = {"quant": "int4", "cpu": "x86-64"}
    build(tiny_module, str(tmp_path / "art"), "onnxruntime", options=opts)
    man = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert man["custom_ops"] == [] and DOMAIN not in man["opset"]


def test_other_block_sizes_and_levels_keep_matmulnbits(tiny_module: Any) -> None:
    text = _lowered(tiny_module, quant="int4", quant_block=64, nbits_kernel="llmir")
    assert "ort.matmul_nbits" in text and "kernel =" not in _op_lines(text, "ort.matmul_nbits")
    text = _lowered(tiny_module, quant="int4", accuracy_level=1, nbits_kernel="llmir")
    assert "ort.matmul_nbits" in text and "kernel =" not in _op_lines(text, "ort.matmul_nbits")


def test_prepack_none_is_fine_with_the_llmir_kernel(tiny_module: Any) -> None:
    text = _lowered(tiny_module, quant="int4", nbits_kernel="llmir", prepack="none")
    assert 'kernel = "llmir"' in text and 'prepack = "none"' in text
    with pytest.raises(InputError, match="need onnxruntime's prepacked layout"):
        _lowered(tiny_module, quant="int4", nbits_kernel="mlas", prepack="none")


def test_bad_nbits_kernel_is_a_usage_error(tiny_module: Any) -> None:
    with pytest.raises(InputError, match="unknown nbits_kernel 'avx512'"):
        _lowered(tiny_module, quant="int4", nbits_kernel="avx512")


def test_llmir_kernel_needs_block_32() -> None:
    from llmir_core.ir.parser import parse_module
    from llmir_core.verifier import verify

    text = (
        "module @m {\n  func.func @main(%x: tensor<2x64xf32>, %w: tensor<8x64xf32>) -> "
        "(tensor<2x8xf32>) {\n    %y = ort.matmul_nbits %x, %w {bits = 4, block_size = 64, "
        'kernel = "llmir"} : (tensor<2x64xf32>, tensor<8x64xf32>) -> tensor<2x8xf32>\n'
        "    return %y : tensor<2x8xf32>\n  }\n}\n"
    )
    errs = [d.message for d in verify(parse_module(text)) if d.severity == "error"]
    assert any('kernel "llmir" takes f32 a and block_size 32' in e for e in errs), errs
