"""llmir's block-quantized matmuls (ai.llmir MatMulNBitsQ4 / MatMulNBitsQ8,
llmir_core/targets/onnxruntime/native/matmul_nbits.c) at several rows of X: the batched decode GEMV
(M <= 16: every weight block read once per call for all rows) and past it the prefill GEMM, under
each instruction-set variant: `avx512` (the AVX-512 VNNI tiles, skipped where the CPU lacks them)
and the AVX2 fallback forced with LLMIR_KERNEL_ISA=avx2 (the library selects when a session
registers it, so each case's session is made under its own setting, and the library's own
report of the variant is checked).

Against numpy on the dequantized blocks (llmir_core.quant.nbits) with X rounded to int8 per
32-block exactly as the kernel does (f32 X for the prefill of 8-bit blocks), held to f32
summation error element by element: a dropped scale or zero point, a wrong block or a wrong row
stride fails. Each row of a call is its own: row m of an 8-row call equals that row alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from llmir_core.quant import nbits
from llmir_core.targets.onnxruntime.native import (
    DOMAIN,
    ISA_ENV,
    NBITS_OP_NAMES,
    kernel_variants,
    missing_avx512,
    register,
    unavailable_reason,
)
from tests.conftest import requires
from tests.decoder.helpers import assert_dot_close, edge_rows

WHY = unavailable_reason()
pytestmark = requires(None if WHY is None else f"llmir's custom ops cannot run: {WHY}")
F32 = np.float32
GEMV_ROWS = 16  # matmul_nbits.c: rows up to which the int8-activation GEMV runs
ROWS = (1, 2, 3, 8, 17)
HAS_AVX512 = not missing_avx512()
VARIANT = {"avx512": "avx512-vnni", "avx2": "avx2"}


def _select(isa: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """LLMIR_KERNEL_ISA for the sessions of one test; afterwards the library selects again from
    the restored environment (the choice is process-wide)."""
    monkeypatch.setenv(ISA_ENV, isa)
    yield isa
    monkeypatch.undo()
    kernel_variants()


@pytest.fixture
def avx512(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The default variant on a CPU with AVX-512 VNNI (skipped elsewhere)."""
    if not HAS_AVX512:
        pytest.skip("this CPU lacks AVX-512 F/BW/VL/DQ/VNNI: only the AVX2 variant runs here")
    yield from _select("avx512", monkeypatch)


@pytest.fixture
def avx2(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The AVX2 fallback, forced."""
    yield from _select("avx2", monkeypatch)


@pytest.fixture(params=["avx512", "avx2"])
def isa(request: pytest.FixtureRequest) -> str:
    """Either variant (through the fixtures above)."""
    return str(request.getfixturevalue(request.param))


def _run(bits: int, zp: bool, swiglu: bool, f16: bool, feeds: dict[str, np.ndarray]) -> Any:
    """A session of one op (made now: under the test's LLMIR_KERNEL_ISA); X -> Y."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    ins = ["x", "b", "s"] + (["z"] if zp else [])
    attrs = {"epilogue": "swiglu"} if swiglu else {}
    node = helper.make_node(NBITS_OP_NAMES[bits], ins, ["y"], domain=DOMAIN, **attrs)
    vi = helper.make_tensor_value_info
    inputs = [
        vi("x", TensorProto.FLOAT, None),
        vi("b", TensorProto.UINT8, None),
        vi("s", TensorProto.FLOAT16 if f16 else TensorProto.FLOAT, None),
    ] + ([vi("z", TensorProto.UINT8, None)] if zp else [])
    g = helper.make_graph([node], "nb", inputs, [vi("y", TensorProto.FLOAT, None)])
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    register(so, ["llmir_ops"])
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"x": x, **feeds})[0]


def _int8_rows(x: np.ndarray) -> np.ndarray:
    """x as the GEMV sees it: codes rint(x * (127 / amax)) per 32-block (f32, half to even)
    times amax / 127, in float64."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(xb * inv)
    return (q.astype(np.float64) * (amax / F32(127)).astype(np.float64)).reshape(m, k)


def _weights(bits: int, n: int, k: int, f16: bool, zp: bool, seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(F32)
    w[:, :32] *= 40.0  # blocks of very different scales: a scale taken from the wrong block shows
    codes, sc, z = nbits.quantize(w, bits, 32, not zp, np.dtype(np.float16 if f16 else F32))
    deq = nbits.dequantize(codes, sc, z, bits, 32, (n, k)).astype(np.float64)
    feeds = {"b": codes.reshape(n, k // 32, -1), "s": sc.reshape(-1)}
    if zp:
        feeds["z"] = z.reshape(-1)  # type: ignore[union-attr]
    return feeds, deq


def _check(got: np.ndarray, x: np.ndarray, deq: np.ndarray, bits: int, swiglu: bool) -> None:
    m, k = x.shape
    xs = _int8_rows(x) if m <= GEMV_ROWS or bits == 4 else x.astype(np.float64)
    full, mag = xs @ deq.T, np.abs(xs) @ np.abs(deq).T
    tol = 5e-7 * np.sqrt(k)
    if not swiglu:
        assert got.shape == full.shape and got.dtype == F32
        assert_dot_close(got, full, mag, tol)
        return
    h = full.shape[1] // 2
    g, u = full[:, :h], full[:, h:]
    with np.errstate(over="ignore"):  # huge rows: exp(-g) = inf, silu(g) = 0 as it should
        want = g / (1.0 + np.exp(-g)) * u
    assert got.shape == want.shape and got.dtype == F32
    # the products' errors through silu(g) * u (|silu'| < 1.1, |silu(g)| <= |g|), the exp's 2e-7
    bound = tol * (1.1 * np.abs(u) * mag[:, :h] + np.abs(g) * mag[:, h:]) + 1e-6 * np.abs(want)
    assert_dot_close(got, want, bound, 1.0)


def _expect_variant(isa: str) -> None:
    assert kernel_variants()["MatMulNBitsQ8"] == VARIANT[isa]
    assert kernel_variants()["MatMulNBitsQ4"] == VARIANT[isa]


def _rows_match(isa: str, bits: int, f16: bool, zp: bool, swiglu: bool, n: int, k: int) -> None:
    feeds, deq = _weights(bits, n, k, f16, zp, n * k + bits)
    run = _run(bits, zp, swiglu, f16, feeds)
    _expect_variant(isa)
    rng = np.random.default_rng(k + n)
    for m in ROWS:
        x = edge_rows(rng.standard_normal((m, k)).astype(F32))  # zero, tiny, huge rows
        _check(run(x), x, deq, bits, swiglu)


CASES = pytest.mark.parametrize("bits", [4, 8])
SCALES = pytest.mark.parametrize(
    "f16,zp", [(False, False), (True, False), (False, True), (True, True)]
)
EPILOGUE = pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
SHAPES = pytest.mark.parametrize("n,k", [(38, 96), (22, 1056), (66, 640)])  # odd / long / even


@CASES
@SCALES
@EPILOGUE
@SHAPES
def test_rows_match_numpy(
    avx512: str, bits: int, f16: bool, zp: bool, swiglu: bool, n: int, k: int
) -> None:
    _rows_match(avx512, bits, f16, zp, swiglu, n, k)


@CASES
@SCALES
@EPILOGUE
@SHAPES
def test_rows_match_numpy_avx2(
    avx2: str, bits: int, f16: bool, zp: bool, swiglu: bool, n: int, k: int
) -> None:
    _rows_match(avx2, bits, f16, zp, swiglu, n, k)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_rows_are_independent(isa: str, bits: int, zp: bool, swiglu: bool) -> None:
    """Row m of an 8-row call is that row computed alone (the same int8 blocks and sums; the f32
    summation order may differ: 8 rows take 16-row panels on AVX-512)."""
    n, k = 70, 352
    feeds, deq = _weights(bits, n, k, True, zp, 7 + bits)
    run = _run(bits, zp, swiglu, True, feeds)
    _expect_variant(isa)
    x = np.random.default_rng(bits).standard_normal((8, k)).astype(F32)
    x[5] *= 1e-3
    together = run(x)
    mag = np.abs(x.astype(np.float64)) @ np.abs(deq).T
    if swiglu:  # |silu(g) u| error <= |u| dg 1.1 + |g| du, both bounded by the products' sizes
        mag = 2.2 * mag[:, : n // 2] * mag[:, n // 2 :]
    for m in range(8):
        alone = run(x[m : m + 1])
        assert_dot_close(together[m : m + 1], alone.astype(np.float64), mag[m : m + 1], 1e-6)
