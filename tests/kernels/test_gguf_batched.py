"""llmir's GGUF matmul (ai.llmir MatMulGGUF, llmir_core/targets/onnxruntime/native/matmul_gguf.c) at the
decode batch sizes, under each kernel variant: the register GEMV (M <= 4), the batched GEMV
(M <= 12, not q4_k / q5_k: each weight row unpacked once per call, X rows in register blocks) and
the prefill tiles (M = 13, 17; q4_k / q5_k from 5), each with AVX-512 VNNI (where the CPU has it; skipped with the reason elsewhere) and
with LLMIR_KERNEL_ISA=avx2 (the library reads it when a session registers it, so each test sets
it before making its session).

Every format at M in {1, 2, 3, 5, 8, 12, 13, 17}, odd N, K with an odd count of 32-blocks (the
two-accumulator loop's tail) and of 16-element mins past a multiple of 8 (the mins' tail),
against numpy on gguf's dequantized weights (tests/kernels/test_gguf_kernel._check: the int8
activation numerics to f32 summation error); the SwiGLU epilogue; row independence (a row at
M = 8 / 12 is the same row computed alone, up to summation order, and bit for bit the same
wherever it sits in the batch).
"""

from __future__ import annotations

import numpy as np
import pytest

from llmir_core.quant import gguf_blocks
from llmir_core.targets.onnxruntime.native import ISA_ENV, missing_avx512
from tests.decoder.helpers import assert_dot_close
from tests.kernels.test_gguf_kernel import WHY, _check, _int8, _session
from tests.quant.blocks import FORMATS, min_part, random_rows

pytestmark = pytest.mark.requires(None if WHY is None else f"llmir's custom ops cannot run: {WHY}")
F32 = np.float32
MS = (1, 2, 3, 5, 8, 12, 13, 17)
VARIANTS = ("avx512", "avx2")


def _use(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = missing_avx512()
    if variant == "avx512" and missing:
        pytest.skip(f"the AVX-512 variant: this CPU lacks {', '.join(missing)}")
    monkeypatch.setenv(ISA_ENV, variant)


def _k(scheme: str) -> int:
    # K-quants: 3 super-blocks (24 32-blocks, 48 mins); 32-element formats: 11 blocks, 22 mins
    return 768 if gguf_blocks.BLOCKS[scheme][0] == 256 else 352


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scheme", FORMATS)
def test_every_format_every_m(scheme: str, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(variant, monkeypatch)
    rng = np.random.default_rng(FORMATS.index(scheme) + 300)
    k = _k(scheme)
    rows = random_rows(rng, scheme, 37, k)
    sess = _session({"format": scheme})
    for m in MS:
        x = rng.standard_normal((m, k)).astype(F32)
        x[m // 2, :32] *= 40  # one block of large values: its codes reach +-127
        _check(scheme, sess.run(None, {"x": x, "w": rows})[0], x, rows)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scheme", ["q5_0", "q4_k", "q6_k", "q8_0", "q4_0"])
def test_swiglu_epilogue_every_m(
    scheme: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(variant, monkeypatch)
    rng = np.random.default_rng(FORMATS.index(scheme) + 400)
    k = _k(scheme)
    rows = random_rows(rng, scheme, 2 * 19, k)  # [gate; up], 19 outputs
    fused = _session({"format": scheme, "epilogue": "swiglu"})
    plain = _session({"format": scheme})
    for m in MS:
        x = rng.standard_normal((m, k)).astype(F32)
        full = plain.run(None, {"x": x, "w": rows})[0]
        _check(scheme, full, x, rows)
        g, u = full[:, :19].astype(np.float64), full[:, 19:].astype(np.float64)
        y = fused.run(None, {"x": x, "w": rows})[0]
        assert y.shape == (m, 19)
        np.testing.assert_allclose(y, g * 0.5 * (1 + np.tanh(g / 2)) * u, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scheme", ["q5_0", "q4_k", "q6_k", "q8_0", "iq4_xs"])
def test_rows_are_independent(scheme: str, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(variant, monkeypatch)
    rng = np.random.default_rng(FORMATS.index(scheme) + 500)
    k = _k(scheme)
    rows = random_rows(rng, scheme, 21, k)
    sess = _session({"format": scheme})
    deq = gguf_blocks.dequantize(rows, scheme, (21, k)).astype(np.float64)
    terms = np.abs(deq) + 2 * min_part(scheme, rows, k)
    for m in (8, 12):
        x = rng.standard_normal((m, k)).astype(F32)
        x *= np.exp(rng.uniform(-3, 3, (m, 1))).astype(F32)  # rows of very different sizes
        y = sess.run(None, {"x": x, "w": rows})[0]
        for r in range(m):  # the row alone (the register GEMV): up to summation order
            alone = sess.run(None, {"x": x[r : r + 1], "w": rows})[0]
            xq, _ = _int8(x[r : r + 1])
            assert_dot_close(y[r : r + 1], alone.astype(np.float64), np.abs(xq) @ terms.T, 2e-6)
        perm = rng.permutation(m)  # the same batch reordered: the same bits per row
        yp = sess.run(None, {"x": x[perm], "w": rows})[0]
        assert np.array_equal(yp.view(np.uint32), y[perm].view(np.uint32))
