"""llmir's 16-bit weight matmuls (ai.llmir MatMulF16 / MatMulBf16,
llmir_core/targets/onnxruntime/native/matmul16.c) at decode-batch row counts, in each kernel
variant (isa.h): the AVX-512 one (the default where the CPU has AVX-512: a GEMV register-blocked
over up to 16 rows of X, 4 weight rows at a time) and the AVX2 one (forced with
LLMIR_KERNEL_ISA=avx2, the choice made when a session registers the library: GEMV to 8 rows),
against numpy in float64:

- M in {1, 2, 3, 5, 8, 12, 16, 17}: one row, every pass shape of the blocked GEMV (passes of at
  most 6 rows), the last GEMV M and the first GEMM M; N leaving 1-3 weight rows past the 4-row
  blocks, K with and without a 32-column step, a 16-column step and a masked tail;
- the SwiGLU epilogue (W = [W_gate; W_up], Y = silu(X W_gate^T) * (X W_up^T));
- the same bits at 1 and 2 threads, and the variant the library reports for these ops.

Each output element is held to its own dot product's f32 summation bound (|x| @ |w|^T), so a
dropped column, a wrong row stride or a row written to the wrong place fails."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from llmir_core.targets.onnxruntime.native import (
    DOMAIN,
    ISA_ENV,
    OP_NAMES,
    kernel_variants,
    library_path,
    missing_avx512,
    register,
    unavailable_reason,
)
from tests.conftest import requires
from tests.decoder.helpers import assert_dot_close

WHY = unavailable_reason()
pytestmark = requires(None if WHY is None else f"llmir's custom ops cannot run: {WHY}")
F64 = np.float64
ROWS = (1, 2, 3, 5, 8, 12, 16, 17)
SHAPES = [(37, 29), (70, 1009), (133, 200)]  # (N, K): K = 29: a 16-step and a mask, no 32-step
RTOL = 5e-7  # times sqrt(K): f32 summation of K products


def _has_avx512() -> bool:
    return not missing_avx512()


def _reselect() -> None:
    """Make the library choose its variant again from LLMIR_KERNEL_ISA as it is now."""
    lib = ctypes.CDLL(library_path())  # the handle onnxruntime loaded: one choice for both
    lib.llmir_isa_select.restype = ctypes.c_char_p
    lib.llmir_isa_select()


@pytest.fixture(
    params=[
        pytest.param(  # a CPU without it is no failure, CI=true or not: the variant never runs there
            "avx512",
            marks=pytest.mark.skipif(
                WHY is None and not _has_avx512(), reason="this CPU lacks AVX-512 F/BW/VL/DQ/VNNI"
            ),
        ),
        "avx2",
    ]
)
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The kernel variant the sessions of the test run with (default: auto, AVX-512 here)."""
    if request.param == "avx2":
        monkeypatch.setenv(ISA_ENV, "avx2")
    else:
        monkeypatch.delenv(ISA_ENV, raising=False)
    yield request.param
    monkeypatch.undo()
    _reselect()  # sessions opened after this test get the default again


def _session(dt: str, w: np.ndarray, epilogue: str = "", threads: int = 2) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if dt == "bf16":  # bf16 by truncation: the bits of an f32's top half
        bits = (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        init = helper.make_tensor("w", TensorProto.BFLOAT16, w.shape, bits.tobytes(), raw=True)
    else:
        from onnx import numpy_helper

        init = numpy_helper.from_array(w.astype(np.float16), "w")
    attrs = {"epilogue": epilogue} if epilogue else {}
    node = helper.make_node(OP_NAMES[dt], ["x", "w"], ["y"], domain=DOMAIN, **attrs)
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [node],
        "m16",
        [vi("x", TensorProto.FLOAT, None)],
        [vi("y", TensorProto.FLOAT, None)],
        [init],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    register(so, ["llmir_ops"])  # selects the variant from LLMIR_KERNEL_ISA
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _weights(dt: str, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random W [n, k] and the exact values the kernel reads from it (f16 or bf16 rounded)."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    if dt == "f16":
        return w, w.astype(np.float16).astype(F64)
    top = (w.view(np.uint32) >> 16 << 16).astype(np.uint32)
    return w, top.view(np.float32).astype(F64)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_rows_match_numpy(variant: str, dt: str, n: int, k: int) -> None:
    w, exact = _weights(dt, n, k, n + k)
    sess = _session(dt, w)
    assert kernel_variants()[OP_NAMES[dt]] == ("avx512-vnni" if variant == "avx512" else "avx2")
    rng = np.random.default_rng(k)
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        assert got.shape == (m, n) and got.dtype == np.float32
        want = x.astype(F64) @ exact.T
        assert_dot_close(got, want, np.abs(x.astype(F64)) @ np.abs(exact).T, RTOL * np.sqrt(k))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_swiglu_epilogue_matches_numpy(variant: str, dt: str) -> None:
    h, k = 67, 1009  # H rows of each half: 16 blocks of 4 and 3 left over
    w, exact = _weights(dt, 2 * h, k, 7)
    sess = _session(dt, w, "swiglu")
    rng = np.random.default_rng(8)
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        assert got.shape == (m, h)
        xa = np.abs(x.astype(F64))
        g, u = x.astype(F64) @ exact[:h].T, x.astype(F64) @ exact[h:].T
        sg, su = xa @ np.abs(exact[:h]).T, xa @ np.abs(exact[h:]).T
        silu = g / (1 + np.exp(-g))
        # each half's summation error through silu(g) * u (|silu'| < 1.1), and the kernel's exp
        bound = RTOL * np.sqrt(k) * (1.1 * sg * np.abs(u) + su * np.abs(silu)) + 1e-6 * np.abs(
            silu * u
        )
        err = np.abs(got - silu * u)
        i = np.unravel_index(int(np.argmax(err - bound)), err.shape)
        assert err[i] <= bound[i], f"m={m} element {i}: got {got[i]}, want {(silu * u)[i]}"


def test_same_bits_at_any_thread_count(variant: str) -> None:
    w, _ = _weights("f16", 301, 576, 3)
    one, two = _session("f16", w, threads=1), _session("f16", w, threads=2)
    rng = np.random.default_rng(5)
    for m in ROWS:
        x = rng.standard_normal((m, 576)).astype(np.float32)
        assert np.array_equal(one.run(None, {"x": x})[0], two.run(None, {"x": x})[0]), m
