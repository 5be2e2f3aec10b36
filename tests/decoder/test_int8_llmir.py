"""llmir's own int8 matmul (`ort.matmul_s8`, ai.llmir MatMulS8 in
llmir_core/targets/onnxruntime/native/matmul_s8.c): the kernel against the op's numpy reference over
decode-shaped (int8 activations per 32 columns) and prefill-shaped M and ragged N/K; an int8 build
with `int8_matmul = llmir` shows the op in the lowered text, computes what its lowered module
computes and stays close to the f32 model and to the QGEMM build; without the capability the
lowering keeps QGEMM and says why. Kernel tests are skipped where the library cannot be built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.dialects.registry import get_op
from llmir_core.ir.printer import print_module
from llmir_core.quant import s8
from llmir_core.targets import build, lower
from llmir_core.targets.onnxruntime.native import DOMAIN, register, unavailable_reason
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import assert_dot_close, edge_rows, greedy, llmir_session, parity

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
PROMPT = np.random.default_rng(1).integers(3, 100, (1, 11))


def _session(packed: np.ndarray, scales: np.ndarray, threads: int = 2) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("MatMulS8", ["x", "w", "s"], ["y"], domain=DOMAIN)
    g = helper.make_graph(
        [node],
        "s8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "s")],
    )
    return llmir_session(g, threads)


def _ops(module: Any, name: str) -> list[Any]:
    return [op for op in module.main.ops if op.name == name]


@needs_kernel
@pytest.mark.parametrize("n,k", [(37, 29), (64, 96), (130, 1000), (576, 576)])
def test_kernel_matches_reference(n: int, k: int) -> None:
    """Activations are rounded per 32 columns (int8 for M <= 4, 7-bit codes with a zero point
    for more rows) and the integer products summed exactly, so the kernel meets the reference
    to f32 summation error."""
    rng = np.random.default_rng(n * k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    codes, scales = s8.quantize_rows(w)
    sess = _session(s8.interleave(codes), scales)
    ref = get_op("ort.matmul_s8").reference  # type: ignore[union-attr]
    assert ref is not None
    for m in (1, 2, 3, 5, 8, 17, 128):  # decode batches (issue 27) and a prefill
        x = edge_rows(rng.standard_normal((m, k)).astype(np.float32))  # zero, tiny, huge rows
        x[0, : min(k, 32)] *= 50.0  # an outlier block: its own scale
        y = sess.run(None, {"x": x})[0]
        want = ref([x, w], {})
        assert y.shape == (m, n)
        # per element, against the size of the row's own products (the reference's rounded x)
        size = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
        assert_dot_close(y, want, 1.1 * size, 5e-7 * np.sqrt(k))
        exact = x.astype(np.float64) @ w.astype(np.float64).T
        assert np.abs(y - exact).max() <= 0.05 * np.abs(exact).max()  # int8 error, not noise
    x3 = rng.standard_normal((2, 3, k)).astype(np.float32)  # leading dims flatten into M
    assert sess.run(None, {"x": x3})[0].shape == (2, 3, n)


def test_layout_roundtrip_and_activation_rule() -> None:
    rng = np.random.default_rng(0)
    codes = rng.integers(-127, 128, (7, 45)).astype(np.int8)
    packed = s8.interleave(codes)
    assert packed.shape == (2, 2, 4, 32) and not packed[1, :, 3].any()  # padded row and cols
    assert (packed[0, 1, 2, :13] == codes[2, 32:45]).all()
    assert (s8.deinterleave(packed, 7, 45) == codes).all()
    q, d = s8.quantize_activations(np.array([[-127.0, 0.5, 63.5] + [0.0] * 30], np.float32))
    assert d.tolist() == [[1.0, 0.0]] and q[0, :3].tolist() == [-127, 0, 64]  # half to even
    q7, d7, z7 = s8.quantize_activations_u7(np.array([[-1.0, 0.0, 3.0], [0.0] * 3], np.float32))
    assert q7.tolist() == [[0, 32, 127], [0, 0, 0]] and z7.tolist() == [[32], [0]]
    assert np.allclose(d7, [[4 / 127], [0.0]])  # range [-1, 3]; a zero block: scale 0
    w = np.array([[1.0, -2.0], [0.0, 0.0]], np.float32)
    c, s = s8.quantize_rows(w)
    assert c.tolist() == [[64, -127], [0, 0]] and np.allclose(s, [2 / 127, 1.0])


@needs_kernel
def test_int8_build_with_llmir_kernel(tiny_module: Any, tmp_path: Path) -> None:
    """`int8_matmul = llmir` is the default where the library builds."""
    low = lower(tiny_module, options={"quant": "int8"})
    text = print_module(low)
    assert "ort.matmul_s8" in text and "ort.dynamic_quantize_matmul" not in text
    assert _ops(low, "ort.matmul_s8")
    build(low, str(tmp_path / "s8"))
    dec = open_decoder(str(tmp_path / "s8"))
    assert parity(low, dec, PROMPT, steps=4) <= 1e-4  # the artifact computes the lowered module
    assert parity(tiny_module, dec, PROMPT, steps=4) <= 0.1  # int8 against f32
    qg = lower(tiny_module, options={"quant": "int8", "int8_matmul": "qgemm-s8pair"})
    build(qg, str(tmp_path / "qgemm"))
    ref = open_decoder(str(tmp_path / "qgemm"))
    assert greedy(dec, PROMPT[0].tolist(), 6) == greedy(ref, PROMPT[0].tolist(), 6)


def test_for_portable_x86_64_the_lowering_takes_int8_blocks(tiny_module: Any) -> None:
    """Not QGEMM's per-tensor activations, which lose far more on real models
    (docs/real-weights.md): MatMulNBits int8 blocks, activations rounded per block."""
    low = lower(tiny_module, options={"quant": "int8", "cpu": "x86-64"})
    assert not _ops(low, "ort.matmul_s8") and not _ops(low, "ort.dynamic_quantize_matmul")
    nb = _ops(low, "ort.matmul_nbits")
    assert nb and {(op.attrs["bits"], op.attrs["block_size"]) for op in nb} == {(8, 32)}
    assert {op.attrs["accuracy_level"] for op in nb} == {4}


@needs_kernel
def test_reimported_artifact_reads_matmul_s8(tiny_module: Any, tmp_path: Path) -> None:
    """`llmir import` of an artifact with MatMulS8 nodes: the imported module multiplies by the
    exactly dequantized weights, so it meets onnxruntime within the kernel's activation rounding
    on a prompt (more than 4 rows) and a decode step."""
    import onnx
    import onnxruntime as ort

    from llmir_core.frontends.onnx import import_onnx
    from llmir_core.runtime.tensors import run_module

    low = lower(tiny_module, options={"quant": "int8", "int8_matmul": "llmir"})
    build(low, str(tmp_path / "a"))
    path = str(tmp_path / "a" / "model.onnx")
    proto = onnx.load(path, load_external_data=False)
    assert "MatMulS8" in {n.op_type for n in proto.graph.node}
    again, _ = import_onnx(path)
    so = ort.SessionOptions()
    register(so, ["llmir_ops"])
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for s, tol in [(6, 0.05), (1, 0.05)]:
        feeds = {
            "input_ids": rng.integers(0, 100, (1, s)).astype(np.int64),
            "positions": np.arange(s)[None].astype(np.int64),
        }
        for i in proto.graph.input:
            if i.name.startswith("past_key_values."):
                d = [x.dim_value for x in i.type.tensor_type.shape.dim]
                feeds[i.name] = np.zeros((1, d[1], 0, d[3]), np.float32)
        want = sess.run(["logits"], feeds)[0]
        got = run_module(again, feeds)["logits"]
        assert np.abs(got - want).max() <= tol * max(1.0, float(np.abs(want).max())), s


def test_int8_matmul_flag_errors(tiny_module: Any, tmp_path: Path) -> None:
    from tests.conftest import run_cli

    (tmp_path / "m.llmir").write_text(print_module(tiny_module))
    r = run_cli("build", "m.llmir", "--int8-matmul", "llmir", "-o", "x", cwd=tmp_path)
    assert r.returncode == 2 and "--int8-matmul applies to --quant int8" in r.stderr
    r = run_cli(
        "build", "m.llmir", "--quant", "int8", "--int8-matmul", "fast", "-o", "x", cwd=tmp_path
    )
    want = "--int8-matmul must be one of llmir, qgemm-s8pair, qgemm-u8, nbits, got 'fast'"
    assert r.returncode == 2 and want in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x").exists()


@needs_kernel
def test_tied_head_stays_nbits(tmp_path: Path) -> None:
    from llmir_core.frontends.hf import import_hf

    from .tiny import LlamaShape, make_llama_folder

    module = import_hf(
        make_llama_folder(tmp_path / "m", LlamaShape(tie=True), tokenizer=False),
        require_tokenizer=False,
    )
    low = lower(module, options={"quant": "int8"})
    (head,) = _ops(low, "ort.matmul_nbits")
    assert head.origin == "hf:lm_head" and head.attrs["bits"] == 8
    assert _ops(low, "ort.gather_block_quantized") and _ops(low, "ort.matmul_s8")
