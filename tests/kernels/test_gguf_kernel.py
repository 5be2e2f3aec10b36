"""llmir's GGUF matmul (ai.llmir MatMulGGUF, llmir_core/targets/onnxruntime/native/matmul_gguf.c) in an
onnxruntime session, for every block format, against numpy on gguf's dequantized weights:

- decode (M <= 16 rows: the register GEMV, then the batched one; tests/kernels/test_gguf_batched.py
  covers every M under both variants) and prefill (M > 16: int8 tiles, with AVX-512 VNNI where the
  CPU has it and the AVX2 path with LLMIR_KERNEL_ISA=avx2): X rounded to int8 per 32-block (what the kernel does,
  emulated exactly) times the exact weights, to f32 summation error; and within the int8
  rounding's own bound of the exact float64 product;
- the same bits at 1 and 2 threads; bad formats and shapes are onnxruntime errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmir_core.quant import gguf_blocks
from llmir_core.targets.onnxruntime.native import DOMAIN, GGUF_OP_NAME, register, unavailable_reason
from tests.conftest import requires
from tests.decoder.helpers import assert_dot_close
from tests.quant.blocks import FORMATS, min_part, random_rows

WHY = unavailable_reason()
pytestmark = requires(None if WHY is None else f"llmir's custom ops cannot run: {WHY}")
F32 = np.float32


def _session(attrs: dict[str, Any], threads: int = 2) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node(GGUF_OP_NAME, ["x", "w"], ["y"], domain=DOMAIN, **attrs)
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [node],
        "gguf",
        [vi("x", TensorProto.FLOAT, None), vi("w", TensorProto.UINT8, None)],
        [vi("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] as the decode kernel sees it (codes rint(x * 127 / amax) per 32-block, times
    amax / 127) and each element's step amax / 127, both float64."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    inv = np.where(amax > 0, F32(127) / np.maximum(amax, F32(1e-30)), F32(0)).astype(F32)
    step = np.broadcast_to((amax / F32(127)).astype(np.float64), xb.shape)
    q = np.rint(xb * inv).astype(np.float64)
    return (q * step).reshape(m, k), step.reshape(m, k)


def _check(scheme: str, got: np.ndarray, x: np.ndarray, rows: np.ndarray) -> None:
    m, k = x.shape
    deq = gguf_blocks.dequantize(rows, scheme, (rows.shape[0], k)).astype(np.float64)
    exact = x.astype(np.float64) @ deq.T
    assert got.shape == exact.shape and got.dtype == F32
    xq, step = _int8(x)
    # the kernel's numerics: sum of scale * (x code . w codes) minus min * d_x * (sum of codes)
    terms = np.abs(deq) + 2 * min_part(scheme, rows, k)
    assert_dot_close(got, xq @ deq.T, np.abs(xq) @ terms.T, 5e-7 * np.sqrt(k))
    # and the int8 rounding stays within half a step per element of the exact product
    bound = 0.5 * step @ np.abs(deq).T + 1e-6 * np.sqrt(k) * (np.abs(x) @ terms.T)
    assert np.all(np.abs(got - exact) <= bound)


@pytest.mark.parametrize("k", [256, 512])
@pytest.mark.parametrize("scheme", FORMATS)
def test_kernel_matches_numpy(scheme: str, k: int) -> None:
    rng = np.random.default_rng(FORMATS.index(scheme) * 10 + k)
    n = 37  # not a multiple of the 4-row GEMV step nor of the 16-row panel
    rows = random_rows(rng, scheme, n, k)
    sess = _session({"format": scheme})
    for m in (1, 3, 17):
        x = rng.standard_normal((m, k)).astype(F32)
        _check(scheme, sess.run(None, {"x": x, "w": rows})[0], x, rows)


@pytest.mark.parametrize("scheme", FORMATS)
def test_avx2_prefill_matches_numpy(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """LLMIR_KERNEL_ISA=avx2 (read when the session registers the library): the AVX2 prefill
    tiles, with their int16 partial sums and the sign trick for 8-bit codes, on a CPU that has
    VNNI too."""
    monkeypatch.setenv("LLMIR_KERNEL_ISA", "avx2")
    rng = np.random.default_rng(FORMATS.index(scheme) + 99)
    rows = random_rows(rng, scheme, 37, 512)
    sess = _session({"format": scheme})
    x = rng.standard_normal((20, 512)).astype(F32)
    x[2, :32] *= 40  # a block of large values: the codes reach +-127
    _check(scheme, sess.run(None, {"x": x, "w": rows})[0], x, rows)


@pytest.mark.parametrize("scheme", ["q4_k", "q6_k", "q5_1", "iq4_xs"])
def test_threads_give_the_same_bits(scheme: str) -> None:
    rng = np.random.default_rng(5)
    rows = random_rows(rng, scheme, 300, 512)
    one, two = _session({"format": scheme}, 1), _session({"format": scheme}, 2)
    for m in (1, 3, 17):
        x = rng.standard_normal((m, 512)).astype(F32)
        a = one.run(None, {"x": x, "w": rows})[0]
        b = two.run(None, {"x": x, "w": rows})[0]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_batched_rows_and_swiglu_epilogue() -> None:
    rng = np.random.default_rng(8)
    rows = random_rows(rng, "q4_k", 64, 256)
    x = rng.standard_normal((2, 9, 256)).astype(F32)  # [batch, seq, K]: M = 18
    plain = _session({"format": "q4_k"}).run(None, {"x": x, "w": rows})[0]
    assert plain.shape == (2, 9, 64)
    _check("q4_k", plain.reshape(18, 64), x.reshape(18, 256), rows)
    fused = _session({"format": "q4_k", "epilogue": "swiglu"})
    for xs in (x, x[:1, :1]):  # prefill and decode
        y = fused.run(None, {"x": xs, "w": rows})[0]
        full = _session({"format": "q4_k"}).run(None, {"x": xs, "w": rows})[0].astype(np.float64)
        g, u = full[..., :32], full[..., 32:]
        assert y.shape == (*xs.shape[:-1], 32)
        np.testing.assert_allclose(y, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


def test_k_zero_and_m_zero() -> None:
    sess = _session({"format": "q6_k"})
    y = sess.run(None, {"x": np.zeros((3, 0), F32), "w": np.zeros((5, 0), np.uint8)})[0]
    assert y.shape == (3, 5) and not y.any()
    rows = random_rows(np.random.default_rng(0), "q6_k", 5, 256)
    assert sess.run(None, {"x": np.zeros((0, 256), F32), "w": rows})[0].shape == (0, 5)


@pytest.mark.parametrize(
    "attrs,x_shape,w_shape,message",
    [
        ({"format": "q7_k"}, (1, 256), (4, 144), "attribute format must be one of"),
        ({}, (1, 256), (4, 144), "attribute format must be one of"),
        ({"format": "q4_k" * 20}, (1, 256), (4, 144), "attribute format must be one of"),
        ({"format": "q4_k"}, (1, 256), (4, 145), "row_bytes whole blocks"),
        ({"format": "q4_k"}, (1, 256), (4, 2, 72), "W must be uint8 \\[N, row_bytes\\]"),
        ({"format": "q4_k"}, (1, 512), (4, 144), "does not match"),
        ({"format": "q4_0"}, (2, 48), (4, 36), "does not match"),
        ({"format": "q4_k", "epilogue": "gelu"}, (1, 256), (4, 144), "unknown epilogue"),
        ({"format": "q4_k", "epilogue": "swiglu"}, (1, 256), (5, 144), "even N"),
    ],
)
def test_refuses_bad_inputs(
    attrs: dict[str, Any], x_shape: tuple[int, ...], w_shape: tuple[int, ...], message: str
) -> None:
    sess = _session(attrs)
    x = np.ones(x_shape, F32)
    w = np.zeros(w_shape, np.uint8)
    with pytest.raises(Exception, match=message) as err:
        sess.run(None, {"x": x, "w": w})
    assert type(err.value).__module__.startswith("onnxruntime")
