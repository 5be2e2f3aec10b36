"""GGUF block dequantization, bit-identical to gguf.quants.dequantize for every format llmir
runs as stored: numpy (llmir_core.quant.gguf_blocks) and the compiled kernels' own dequantizer
(`llmir_gguf_dequant` in llmir_core/targets/onnxruntime/native/matmul_gguf.c, through ctypes)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from llmir_core.quant import gguf_blocks
from llmir_core.targets.onnxruntime.dialect import GGUF_FORMATS
from llmir_core.targets.onnxruntime.native import library_path, unavailable_reason
from tests.conftest import import_or_skip, requires

from .blocks import FORMATS, random_rows

gguf_quants = import_or_skip("gguf.quants", "gguf is the oracle for the block layouts")

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom ops cannot run: {WHY}")


def _gtype(scheme: str) -> object:
    from gguf import GGMLQuantizationType

    return getattr(GGMLQuantizationType, scheme.upper())


def _reference(raw: np.ndarray, scheme: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gguf_quants.dequantize(raw, _gtype(scheme)), np.float32)


def _same_bits(ours: np.ndarray, ref: np.ndarray) -> None:
    """Equal bit for bit, NaN where the reference is NaN (NaN payloads aside)."""
    assert ours.shape == ref.shape and ours.dtype == np.float32
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    bad = np.flatnonzero(ours[~nan].view(np.uint32) != ref[~nan].view(np.uint32))
    assert bad.size == 0, (
        f"{bad.size} values differ, first: {ours[~nan][bad[0]]} vs {ref[~nan][bad[0]]}"
    )


def test_formats_and_sizes_match_gguf() -> None:
    assert set(GGUF_FORMATS) == set(gguf_blocks.BLOCKS)
    for scheme, size in gguf_blocks.BLOCKS.items():
        assert size == tuple(gguf_quants.GGML_QUANT_SIZES[_gtype(scheme)])


@pytest.mark.parametrize("scheme", FORMATS)
def test_numpy_matches_gguf(scheme: str) -> None:
    rng = np.random.default_rng(len(scheme) * 7 + FORMATS.index(scheme))
    raw = random_rows(rng, scheme, 6, 1024)
    ref = _reference(raw, scheme)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    _same_bits(gguf_blocks.dequantize(raw, scheme, (6, 1024)), ref)


@pytest.mark.parametrize("scheme", FORMATS)
def test_numpy_matches_gguf_on_any_bytes(scheme: str) -> None:
    """Random bytes everywhere, the f16 scales too (inf, NaN, subnormal): the same values and
    NaN at the same places."""
    raw = np.random.default_rng(99).integers(
        0, 256, (40, gguf_blocks.BLOCKS[scheme][1] * 8), np.uint8
    )
    elems = gguf_blocks.BLOCKS[scheme][0] * 8
    with np.errstate(all="ignore"):
        ours = gguf_blocks.dequantize(raw, scheme, (40, elems))
    _same_bits(ours, _reference(raw, scheme))


def _dequant_fn() -> object:
    fn = ctypes.CDLL(library_path()).llmir_gguf_dequant
    fn.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    fn.restype = ctypes.c_int
    return fn


def _c_dequant(scheme: str, raw: np.ndarray, rows: int, cols: int) -> tuple[int, np.ndarray]:
    out = np.full((max(rows, 0), cols), np.float32(7.0))
    raw = np.ascontiguousarray(raw)
    rc = _dequant_fn()(scheme.encode(), raw.ctypes.data, rows, cols, out.ctypes.data)  # type: ignore[operator]
    return rc, out


@needs_kernel
@pytest.mark.parametrize("scheme", FORMATS)
def test_kernel_dequant_matches_gguf(scheme: str) -> None:
    rng = np.random.default_rng(FORMATS.index(scheme))
    raw = random_rows(rng, scheme, 5, 512)
    rc, out = _c_dequant(scheme, raw, 5, 512)
    assert rc == 0
    _same_bits(out, _reference(raw, scheme))
    # any bytes: non-finite scales give NaN / inf where gguf gives them
    raw = rng.integers(0, 256, raw.shape, np.uint8)
    rc, out = _c_dequant(scheme, raw, 5, 512)
    assert rc == 0
    _same_bits(out, _reference(raw, scheme))


@needs_kernel
def test_kernel_dequant_refuses_bad_arguments() -> None:
    raw = np.zeros(144 * 2, np.uint8)
    assert _c_dequant("q4_k", raw, 1, 512)[0] == 0
    assert _c_dequant("q7_k", raw, 1, 256)[0] == 1
    assert _c_dequant("Q4_K", raw, 1, 256)[0] == 1
    assert _c_dequant("q4_k", raw, 1, 320)[0] == 2  # not whole blocks
    assert _c_dequant("q4_k", raw, -1, 256)[0] == 2
    rc, out = _c_dequant("q4_k", raw, 0, 256)
    assert rc == 0 and out.size == 0


@pytest.mark.parametrize("scheme", FORMATS)
def test_numpy_empty_tensors(scheme: str) -> None:
    elems = gguf_blocks.BLOCKS[scheme][0]
    for shape in ((0, elems), (3, 0), (2, 0, elems)):
        out = gguf_blocks.dequantize(np.zeros(0, np.uint8), scheme, shape)
        assert out.shape == shape and out.dtype == np.float32
