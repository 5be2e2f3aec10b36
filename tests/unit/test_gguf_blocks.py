"""Block quantization (llmir_core.quant): GGUF formats bit-exact with the gguf package, nbits
bit-exact with onnxruntime's MatMulNBits quantizer, and the llm.quantize/dequantize ops."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from llmir_core.builder import Builder
from llmir_core.interp import run
from llmir_core.ir.core import Function, Module
from llmir_core.ir.types import GGUF_QUANTS, DType, QuantType, TensorType
from llmir_core.quant import dequantize, gguf_blocks, nbits, quantize
from llmir_core.verifier import verify
from llmir_core.weights import PackedArray, expected_nbytes

gguf_quants = pytest.importorskip("gguf.quants", reason="gguf is the oracle for the block layouts")
from gguf import GGMLQuantizationType  # noqa: E402

SIMPLE = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
K_QUANTS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
# byte offsets of the f16 fields (d, dmin) inside one k-quant block
K_F16_FIELDS = {"q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def _gtype(scheme: str) -> GGMLQuantizationType:
    return getattr(GGMLQuantizationType, scheme.upper())


def _awkward_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Rows of very different scales, plus the blocks quantizers get wrong: zeros, ties, constants."""
    x = (rng.standard_normal((rows, cols)) * rng.uniform(1e-3, 50.0, (rows, 1))).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = 3.0
    x[1, 32:64] = np.tile([-2.0, 2.0], 16)  # |max| tie between signs
    x[2, :32] = rng.integers(-8, 8, 32).astype(np.float32) * 0.25  # values on the grid
    return x


@pytest.mark.parametrize("scheme", SIMPLE)
def test_quantize_matches_gguf_bit_exact(scheme: str) -> None:
    rng = np.random.default_rng(1)
    x = _awkward_rows(rng, 6, 256)
    ours = gguf_blocks.quantize(x, scheme)
    ref = gguf_quants.quantize(x, _gtype(scheme))
    assert ours.dtype == np.uint8
    assert np.array_equal(ours, ref.reshape(-1))
    assert ours.size == expected_nbytes(TensorType(x.shape, GGUF_QUANTS[scheme]))


@pytest.mark.parametrize("scheme", SIMPLE)
def test_dequantize_matches_gguf_bit_exact(scheme: str) -> None:
    rng = np.random.default_rng(2)
    x = _awkward_rows(rng, 5, 128)
    data = gguf_quants.quantize(x, _gtype(scheme))
    ours = gguf_blocks.dequantize(data, scheme, x.shape)
    ref = gguf_quants.dequantize(data, _gtype(scheme))
    assert ours.dtype == np.float32 and ours.shape == x.shape
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    # and the decode is close to the input (a sanity check on the layout, not just agreement)
    assert np.abs(ours - x).max() <= np.abs(x).max() * 0.2


def _random_k_blocks(rng: np.random.Generator, scheme: str, n: int) -> np.ndarray:
    _, nbytes = gguf_blocks.BLOCKS[scheme]
    raw = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    for off in K_F16_FIELDS[scheme]:  # finite scales, so every value is comparable bit for bit
        d = (rng.standard_normal(n) * 0.05).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("scheme", K_QUANTS)
def test_k_quant_dequantize_matches_gguf_bit_exact(scheme: str) -> None:
    rng = np.random.default_rng(3)
    raw = _random_k_blocks(rng, scheme, 12)  # 12 super-blocks = a [3, 1024] tensor
    ref = gguf_quants.dequantize(raw.reshape(3, -1), _gtype(scheme))
    ours = gguf_blocks.dequantize(raw, scheme, (3, 1024))
    assert ref.shape == (3, 1024)
    assert np.isfinite(ref).all()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_block_table_matches_types_module() -> None:
    from llmir_core.ir.types import GGUF_BLOCK_BYTES

    for scheme, q in GGUF_QUANTS.items():  # every IR scheme has its block table entry
        elems, nbytes = gguf_blocks.BLOCKS[scheme]
        assert (q.super_block or q.block, GGUF_BLOCK_BYTES[scheme]) == (elems, nbytes)
        assert (elems, nbytes) == tuple(gguf_quants.GGML_QUANT_SIZES[_gtype(scheme)])


def test_bad_shapes_and_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_blocks.quantize(np.zeros((2, 48), np.float32), "q4_0")
    with pytest.raises(ValueError, match="not supported"):
        gguf_blocks.quantize(np.zeros((1, 256), np.float32), "q4_k")
    with pytest.raises(ValueError, match="needs 36 bytes, got 35"):
        gguf_blocks.dequantize(np.zeros(35, np.uint8), "q4_0", (1, 64))
    with pytest.raises(ValueError, match="unknown GGUF block format"):
        gguf_blocks.dequantize(np.zeros(18, np.uint8), "q7_0", (1, 32))


def test_round_half_away_from_zero() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -1.2], np.float32)
    assert gguf_blocks.round_half_away(x).tolist() == [1, 2, 3, -1, -3, 0, -1]


def test_no_gguf_import_at_run_time() -> None:
    code = (
        "import sys, numpy as np; import llmir_core.quant, llmir_core.dialects.llm; "
        "from llmir_core.quant import gguf_blocks; "
        "gguf_blocks.dequantize(gguf_blocks.quantize(np.ones((1, 32), np.float32), 'q8_0'), 'q8_0', (1, 32)); "
        "print(sorted(m for m in ('gguf', 'onnxruntime', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- nbits ---------------------------------------------------------------------------------------

ort_pybind = pytest.importorskip(
    "onnxruntime.capi._pybind_state", reason="onnxruntime is the nbits oracle"
)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block,k", [(16, 80), (32, 96), (64, 128)])
def test_nbits_quantize_matches_onnxruntime(bits: int, symmetric: bool, block: int, k: int) -> None:
    rng = np.random.default_rng(bits * 100 + block)
    n = 5
    w = (rng.standard_normal((k, n)) * rng.uniform(0.1, 3.0, (1, n))).astype(
        np.float32
    )  # ORT: [K, N]
    w[:block, 0] = 0.0
    w[:block, 1] = np.abs(w[:block, 1])  # all-positive block: asymmetric zero point 0
    kb, per = k // block, 8 // bits
    packed = np.zeros((n, kb, block * bits // 8), np.uint8)
    zp = np.zeros((n, (kb + per - 1) // per), np.uint8)
    scales = np.zeros((n, kb), np.float32)
    fn = getattr(ort_pybind, f"quantize_matmul_{bits}bits")
    fn(packed, w, scales, zp, block, n, k, symmetric)
    codes, ours_scales, ours_zp = nbits.quantize(w.T, bits, block, symmetric, np.dtype(np.float32))
    assert np.array_equal(codes, packed.reshape(-1))
    assert np.array_equal(ours_scales, scales)
    if symmetric:
        assert ours_zp is None
    else:
        assert ours_zp is not None and np.array_equal(ours_zp, zp)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_nbits_pack_unpack_inverse(bits: int) -> None:
    rng = np.random.default_rng(bits)
    q = rng.integers(0, 1 << bits, (3, 40), dtype=np.uint8)
    b = nbits.pack_codes(q, bits)
    assert b.shape == (3, 40 * bits // 8)
    assert np.array_equal(nbits.unpack_codes(b, bits, 40), q)
    if bits == 4:  # element 2i in the low nibble, 2i+1 in the high nibble
        assert b[0, 0] == q[0, 0] | (q[0, 1] << 4)


@pytest.mark.parametrize("zero", ["none", "int"])
def test_nbits_roundtrip_error_is_within_one_step(zero: str) -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    qt = QuantType("nbits", 4, 32, DType.f32, zero)
    packed, scales, zp = quantize(w, qt)
    assert scales is not None and (zp is None) == (zero == "none")
    back = dequantize(packed, scales, zp)
    step = np.repeat(np.abs(scales), 32, axis=1)
    # within one step: the code range is asymmetric (-8..7), so the far end may clip by a step
    assert np.all(np.abs(back - w) <= step + 1e-6)
    assert np.abs(back - w).mean() < np.abs(scales).mean() * 0.5


def test_nbits_errors() -> None:
    with pytest.raises(ValueError, match="multiple of block"):
        nbits.quantize(np.zeros((2, 40), np.float32), 4, 32, True, np.dtype(np.float32))
    with pytest.raises(ValueError, match="bits"):
        nbits.quantize(np.zeros((2, 32), np.float32), 3, 32, True, np.dtype(np.float32))
    p = PackedArray(np.zeros(16, np.uint8), QuantType("nbits", 4, 32, DType.f32, "none"), (1, 32))
    with pytest.raises(ValueError, match="needs its scales"):
        dequantize(p)
    with pytest.raises(ValueError, match="scales have shape"):
        dequantize(p, np.zeros((1, 2), np.float32))


# -- the ops ---------------------------------------------------------------------------------------


def _module(name: str, arg_types: list[TensorType], attrs: dict[str, object]) -> Module:
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", t) for i, t in enumerate(arg_types)]
    b.ret(*b.create(name, args, attrs).results)
    m = Module("t", [fn], {"llmir.dialects": ("core", "llm")})
    assert verify(m) == []
    return m


@pytest.mark.parametrize("scheme", SIMPLE)
def test_quantize_dequantize_ops_match_gguf(scheme: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = GGUF_QUANTS[scheme]
    (packed,) = run(_module("llm.quantize", [TensorType((4, 64), DType.f32)], {"format": q}), [x])
    assert isinstance(packed, PackedArray) and packed.qtype == q and packed.shape == (4, 64)
    assert np.array_equal(packed.data, gguf_quants.quantize(x, _gtype(scheme)).reshape(-1))
    (y,) = run(_module("llm.dequantize", [TensorType((4, 64), q)], {"dtype": DType.f16}), [packed])
    ref = gguf_quants.dequantize(packed.data.reshape(4, -1), _gtype(scheme))
    assert y.dtype == np.float16 and np.array_equal(y, ref.astype(np.float16))


def test_k_quant_dequantize_op() -> None:
    raw = _random_k_blocks(np.random.default_rng(5), "q6_k", 2)
    q = GGUF_QUANTS["q6_k"]
    (y,) = run(
        _module("llm.dequantize", [TensorType((2, 256), q)], {}),
        [PackedArray(raw.reshape(-1), q, (2, 256))],
    )
    assert np.array_equal(y, gguf_quants.dequantize(raw, GGMLQuantizationType.Q6_K).reshape(2, 256))


def test_nbits_quantize_op_results() -> None:
    qt = QuantType("nbits", 4, 16, DType.f16, "int")
    m = _module("llm.quantize", [TensorType((3, 64), DType.f32)], {"format": qt})
    assert [str(r.type) for r in m.main.ops[0].results] == [
        "tensor<3x64x!quant<nbits, bits=4, block=16, scale=f16, zero=int>>",
        "tensor<3x4xf16>",
        "tensor<3x2xu8>",
    ]
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    packed, scales, zp = run(m, [x])
    assert packed.data.shape == (96,) and scales.dtype == np.float16 and zp.dtype == np.uint8
    (y,) = run(
        _module("llm.dequantize", [m.main.ops[0].results[i].type for i in range(3)], {}),
        [packed, scales, zp],
    )
    assert np.abs(y - x).max() < 0.25
