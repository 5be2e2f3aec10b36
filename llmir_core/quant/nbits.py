"""The `nbits` scheme: onnxruntime MatMulNBits-style block quantization along the last dim.

A logical weight W of shape [..., N, K] (HF layout [out, in]: blocks run along K, the reduction
dim) with `bits` in {2, 4, 8} and `block` elements per block (K % block == 0) is stored as three
arrays, so they can be handed to `com.microsoft.MatMulNBits` byte for byte:

- codes (the PackedArray's bytes): per row, the K unsigned codes packed 8/bits per byte, lowest
  bits first (for 4 bits: element 2i in the low nibble, 2i+1 in the high nibble) — row n's bytes
  are MatMulNBits' B[n, :, :] of shape [K/block, block*bits/8];
- scales: [..., N, K/block] in the QuantType's `scale` dtype — MatMulNBits' `scales` flattened;
- zero points (zero=int only): [..., N, ceil((K/block) * bits / 8)] uint8, the per-block codes
  of each row packed like the codes, unused slots of a row's last byte holding the midpoint
  2**(bits-1) as onnxruntime's quantizer writes them (MatMulNBits' `zero_points` flattened). Symmetric formats
  (zero=none) store none and use the midpoint 2**(bits-1).

Dequantization: x = (code - zero) * scale, in float32.
Quantization follows MLAS (onnxruntime's `quantize_matmul_{2,4,8}bits`), in float32:
symmetric: scale = m / -2**(bits-1) where m is the block's max or min, whichever has the larger
magnitude (min on ties); asymmetric: lo = min(min, 0), hi = max(max, 0),
scale = (hi - lo) / (2**bits - 1), zero = clamp(roundf(-lo / scale), 0, 2**bits - 1);
code = clamp(roundf(x * (1 / scale) + zero), 0, 2**bits - 1) with roundf rounding halves away
from zero and 1 / 0 taken as 0. A scale dtype narrower than f32 is rounded first, and the codes
are computed with the rounded scale.
"""

from __future__ import annotations

import numpy as np

from .gguf_blocks import round_half_away

SUPPORTED_BITS = (2, 4, 8)
_F32 = np.float32


def _check(bits: int, block: int, k: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"nbits supports bits in {SUPPORTED_BITS}, got {bits}")
    if block <= 0 or k % block:
        raise ValueError(f"nbits needs the last dim ({k}) to be a multiple of block ({block})")


def pack_codes(q: np.ndarray, bits: int, fill: int = 0) -> np.ndarray:
    """[..., M] codes < 2**bits -> [..., ceil(M*bits/8)] bytes, lowest bits first; unused
    high slots of the last byte hold `fill`."""
    per = 8 // bits
    m = q.shape[-1]
    pad = (-m) % per
    if pad:
        q = np.concatenate([q, np.full((*q.shape[:-1], pad), fill, np.uint8)], axis=-1)
    g = q.astype(np.uint8).reshape(*q.shape[:-1], -1, per)
    shifts = np.arange(per, dtype=np.uint8) * bits
    return np.bitwise_or.reduce(g << shifts, axis=-1).astype(np.uint8)


def unpack_codes(b: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of pack_codes: [..., nbytes] -> [..., count] codes."""
    per = 8 // bits
    shifts = np.arange(per, dtype=np.uint8) * bits
    q = (b[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return q.reshape(*b.shape[:-1], -1)[..., :count]


def codes_nbytes(shape: tuple[int, ...], bits: int) -> int:
    return (int(np.prod(shape)) * bits + 7) // 8


def zero_bytes_per_row(k: int, block: int, bits: int) -> int:
    return (k // block * bits + 7) // 8


def quantize(
    w: np.ndarray, bits: int, block: int, symmetric: bool, scale_dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Quantize [..., N, K] floats -> (flat code bytes, scales, packed zero points or None)."""
    w = np.asarray(w)
    k = w.shape[-1]
    _check(bits, block, k)
    top = _F32((1 << bits) - 1)
    blocks = w.astype(_F32).reshape(*w.shape[:-1], k // block, block)
    lo, hi = blocks.min(axis=-1), blocks.max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if symmetric:
            m = np.where(np.abs(hi) > np.abs(lo), hi, lo)
            scale = (m / _F32(-(1 << (bits - 1)))).astype(scale_dtype)
            zero = np.full(scale.shape, _F32(1 << (bits - 1)))
        else:
            lo, hi = np.minimum(lo, _F32(0)), np.maximum(hi, _F32(0))
            s32 = ((hi - lo) / top).astype(_F32)
            zf = np.where(s32 != 0, _F32(0) - lo / s32, lo)
            zero = np.clip(round_half_away(zf), 0, top).astype(_F32)
            scale = s32.astype(scale_dtype)
        s = scale.astype(_F32)
        inv = np.where(s != 0, _F32(1) / s, _F32(0)).astype(_F32)
        q = np.clip(round_half_away(blocks * inv[..., None] + zero[..., None]), 0, top)
    codes = pack_codes(q.astype(np.uint8).reshape(w.shape), bits).reshape(-1)
    zp = None if symmetric else pack_codes(zero.astype(np.uint8), bits, 1 << (bits - 1))
    return codes, scale, zp


def dequantize(
    codes: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    bits: int,
    block: int,
    shape: tuple[int, ...],
) -> np.ndarray:
    """Decode to float32 [..., N, K]; zero_points None means the midpoint 2**(bits-1)."""
    k = shape[-1]
    _check(bits, block, k)
    raw = np.asarray(codes).view(np.uint8).reshape(-1)
    if raw.size != codes_nbytes(shape, bits):
        raise ValueError(
            f"nbits codes for shape {list(shape)} need {codes_nbytes(shape, bits)} "
            f"bytes, got {raw.size}"
        )
    nb = k // block
    lead = tuple(shape[:-1])
    if tuple(np.shape(scales)) != (*lead, nb):
        raise ValueError(f"scales have shape {list(np.shape(scales))}, expected {[*lead, nb]}")
    q = unpack_codes(raw.reshape(*lead, -1), bits, k).astype(_F32).reshape(*lead, nb, block)
    if zero_points is None:
        zero = np.full((*lead, nb), _F32(1 << (bits - 1)))
    else:
        zpb = zero_bytes_per_row(k, block, bits)
        if tuple(np.shape(zero_points)) != (*lead, zpb):
            raise ValueError(
                f"zero points have shape {list(np.shape(zero_points))}, expected {[*lead, zpb]}"
            )
        zero = unpack_codes(np.asarray(zero_points, np.uint8), bits, nb).astype(_F32)
    s = np.asarray(scales).astype(_F32)
    return ((q - zero[..., None]) * s[..., None]).reshape(shape)
