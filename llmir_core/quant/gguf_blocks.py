"""GGUF (ggml) block-quantization formats: vectorized numpy encode/decode, no gguf import.

Every format stores a row-major tensor as a sequence of fixed-size blocks along the last dim
(`BLOCKS[scheme] = (elements per block, bytes per block)`); a row's length must be a multiple
of the block. Byte layouts of one block (all multi-byte fields little-endian, `f16` = IEEE half):

  q4_0  (32 elems, 18 B):  d:f16 | qs[16]            x[j] = d * ((qs[j] & 15) - 8),
                                                     x[j+16] = d * ((qs[j] >> 4) - 8)
  q4_1  (32, 20 B):        d:f16 | m:f16 | qs[16]    x = d * nibble + m  (nibbles as q4_0)
  q5_0  (32, 22 B):        d:f16 | qh:u32 | qs[16]   q = nibble | (bit j of qh) << 4; x = d * (q - 16)
  q5_1  (32, 24 B):        d:f16 | m:f16 | qh:u32 | qs[16]             x = d * q + m
  q8_0  (32, 34 B):        d:f16 | qs:i8[32]         x = qs * d
  q2_k  (256, 84 B):       scales[16] | qs[64] | d:f16 | dmin:f16; 16 sub-blocks of 16; scale
                           low nibble * d, min high nibble * dmin; 2-bit codes, 4 per byte
  q3_k  (256, 110 B):      hmask[32] | qs[64] | scales[12] (16 x 6-bit, offset 32) | d:f16
  q4_k  (256, 144 B):      d:f16 | dmin:f16 | scales[12] (8 x 6-bit scale + 8 x 6-bit min) |
                           qs[128]; sub-block 2c / 2c+1 are the low / high nibbles of bytes
                           32c..32c+31; x = (d * sc) * q - (dmin * m)
  q5_k  (256, 176 B):      d | dmin | scales[12] | qh[32] | qs[128]; bit i of qh[j] is the
                           fifth bit of element j of sub-block i
  q6_k  (256, 210 B):      ql[128] | qh[64] | scales:i8[16] | d:f16; q = (low 4 | high 2 << 4) - 32,
                           x = (d * scale) * q over 16 sub-blocks of 16
  iq4_nl (32, 18 B):       d:f16 | qs[16]            x = d * KVALUES[nibble] (nibbles as q4_0)
  iq4_xs (256, 136 B):     d:f16 | scales_h:u16 | scales_l[4] | qs[128]; 8 sub-blocks of 32,
                           scale j = (low nibble j of scales_l | bits 2j..2j+1 of scales_h << 4)
                           - 32; sub-block j = the low, then the high nibbles of qs[16j..16j+15];
                           x = (d * scale) * KVALUES[nibble]

Decoding is bit-exact with `gguf.quants.dequantize` (the same float32 operations in the same
order). `quantize` implements q4_0, q4_1, q5_0, q5_1 and q8_0 bit-exactly with
`gguf.quants.quantize` (ggml's reference `quantize_row_*_ref`, with roundf = half away from 0).
"""

from __future__ import annotations

import numpy as np

# scheme -> (elements per block, bytes per block)
BLOCKS: dict[str, tuple[int, int]] = {
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "q8_0": (32, 34),
    "q2_k": (256, 84),
    "q3_k": (256, 110),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
    "iq4_nl": (32, 18),
    "iq4_xs": (256, 136),
}
QUANTIZABLE = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
# the 16 values of the iq4_nl / iq4_xs non-linear 4-bit grid
KVALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8
)

_F32 = np.float32


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per row (shape [n, 2]) as one float32 column ([n, 1])."""
    return np.ascontiguousarray(b).view(np.float16).astype(_F32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16*k] bytes -> [n, 32*k] codes: each 16-byte group gives 16 low nibbles, then 16 high."""
    n = qs.shape[0]
    g = qs.reshape(n, -1, 1, 16)
    return np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(n, -1)


def _bits_le(words: np.ndarray, count: int) -> np.ndarray:
    """Bit i (i < count) of each little-endian u32 row ([n, 4] bytes -> [n, count] of 0/1)."""
    w = np.ascontiguousarray(words).view("<u4")
    return ((w >> np.arange(count, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte q4_k/q5_k scale field -> (8 scales, 8 mins), 6 bits each."""
    lo, mn, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    mins = np.concatenate([mn & 0x3F, (hi >> 4) | ((mn >> 2) & 0x30)], axis=1)
    return sc, mins


def _dq_q4_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return _f16(b[:, :2]) * q.astype(_F32)


def _dq_q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(_F32) + _f16(b[:, 2:4])


def _q5_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    return _nibbles(qs) | (_bits_le(qh, 32) << 4)


def _dq_q5_0(b: np.ndarray) -> np.ndarray:
    q = _q5_codes(b[:, 2:6], b[:, 6:]).astype(np.int8) - np.int8(16)
    return _f16(b[:, :2]) * q.astype(_F32)


def _dq_q5_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * _q5_codes(b[:, 4:8], b[:, 8:]).astype(_F32) + _f16(b[:, 2:4])


def _dq_q8_0(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(_F32) * _f16(b[:, :2])


def _dq_q2_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0x0F).astype(_F32))[:, :, None]
    ml = (dmin * (scales >> 4).astype(_F32))[:, :, None]
    shifts = np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
    q = ((qs.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 16, 16).astype(_F32)
    return (dl * q - ml).reshape(n, 256)


def _dq_q3_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    hmask, qs, sraw, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = np.concatenate([sraw[:, :8] & 0x0F, sraw[:, :8] >> 4], axis=1)  # 16 x 4 bits
    high = sraw[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8)[None, :, None]
    sc = (low | ((high.reshape(n, 16) & 3) << 4)).astype(np.int8) - np.int8(32)
    dl = (d * sc.astype(_F32))[:, :, None]
    q2 = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
    hb = (hmask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    # a cleared hmask bit subtracts 4
    q = q2.reshape(n, 16, 16).astype(np.int8) - ((hb.reshape(n, 16, 16) ^ 1) << 2).astype(np.int8)
    return (dl * q.astype(_F32)).reshape(n, 256)


def _k_subblock_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mins = _k_scale_min(b[:, 4:16])
    return (d * sc.astype(_F32))[:, :, None], (dmin * mins.astype(_F32))[:, :, None]


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8, 32]: sub-block 2c/2c+1 = low/high nibbles of bytes 32c..32c+31."""
    n = qs.shape[0]
    g = qs.reshape(n, 4, 1, 32)
    return np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(n, 8, 32)


def _dq_q4_k(b: np.ndarray) -> np.ndarray:
    dl, ml = _k_subblock_scales(b)
    q = _k_low_nibbles(b[:, 16:144]).astype(_F32)
    return (dl * q - ml).reshape(b.shape[0], 256)


def _dq_q5_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    dl, ml = _k_subblock_scales(b)
    qh = (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (_k_low_nibbles(b[:, 48:176]) | (qh << 4)).astype(_F32)
    return (dl * q - ml).reshape(n, 256)


def _dq_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    dl = (d * np.ascontiguousarray(sc).view(np.int8).astype(_F32))[:, :, None]
    g = ql.reshape(n, 2, 1, 64)
    low = np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(n, 8, 32)
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
    q = (low | (high.reshape(n, 8, 32) << 4)).astype(np.int8) - np.int8(32)
    return (dl * q.reshape(n, 16, 16).astype(_F32)).reshape(n, 256)


def _dq_iq4_nl(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * KVALUES[_nibbles(b[:, 2:])].astype(_F32)


def _dq_iq4_xs(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = _f16(b[:, :2])
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2")  # [n, 1]
    sl = b[:, 4:8]
    low = np.stack([sl & 0x0F, sl >> 4], axis=2).reshape(n, 8)
    high = ((sh >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    sc = (low | (high << 4)).astype(np.int8) - np.int8(32)
    dl = (d * sc.astype(_F32))[:, :, None]
    q = KVALUES[_nibbles(b[:, 8:])].astype(_F32).reshape(n, 8, 32)
    return (dl * q).reshape(n, 256)


_DEQUANT = {
    "q4_0": _dq_q4_0,
    "q4_1": _dq_q4_1,
    "q5_0": _dq_q5_0,
    "q5_1": _dq_q5_1,
    "q8_0": _dq_q8_0,
    "q2_k": _dq_q2_k,
    "q3_k": _dq_q3_k,
    "q4_k": _dq_q4_k,
    "q5_k": _dq_q5_k,
    "q6_k": _dq_q6_k,
    "iq4_nl": _dq_iq4_nl,
    "iq4_xs": _dq_iq4_xs,
}


def packed_nbytes(scheme: str, shape: tuple[int, ...]) -> int:
    """Bytes that `shape` takes in `scheme`; ValueError unless rows split into whole blocks."""
    elems, nbytes = BLOCKS[scheme]
    if not shape or shape[-1] % elems:
        raise ValueError(
            f"{scheme} needs a last dim that is a multiple of {elems}, got shape {list(shape)}"
        )
    return int(np.prod(shape)) // elems * nbytes


def dequantize(data: np.ndarray, scheme: str, shape: tuple[int, ...]) -> np.ndarray:
    """Decode packed bytes (any shape, uint8) to a float32 array of the logical `shape`."""
    if scheme not in _DEQUANT:
        raise ValueError(f"unknown GGUF block format {scheme!r} (known: {', '.join(_DEQUANT)})")
    raw = np.asarray(data).view(np.uint8).reshape(-1)
    want = packed_nbytes(scheme, tuple(shape))
    if raw.size != want:
        raise ValueError(f"{scheme} data of shape {list(shape)} needs {want} bytes, got {raw.size}")
    if raw.size == 0:  # no blocks (a zero dim)
        return np.zeros(shape, _F32)
    _, nbytes = BLOCKS[scheme]
    return _DEQUANT[scheme](raw.reshape(-1, nbytes)).astype(_F32, copy=False).reshape(shape)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C `roundf`: halves round away from zero (computed without the x + 0.5 rounding error)."""
    a = np.abs(x)
    f = np.floor(a)
    return np.sign(x) * (f + np.floor(2 * (a - f)))


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, _F32(0), _F32(1) / d).astype(_F32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[n, 32] codes < 16 -> [n, 16] bytes: element j low nibble, element j+16 high nibble."""
    return (q[:, :16] & 0x0F) | (q[:, 16:] << 4)


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).view(np.uint8).reshape(d.shape[0], 2)


def _signed_max(blocks: np.ndarray) -> np.ndarray:
    """Per block, the element with the largest magnitude (first one on ties), sign kept."""
    return np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)


def _codes(scaled: np.ndarray, top: int) -> np.ndarray:
    return np.trunc(scaled).astype(_F32).astype(np.uint8).clip(0, top)


def _q_q4_0(x: np.ndarray) -> np.ndarray:
    d = _signed_max(x) / _F32(-8)
    q = _codes(x * _inverse(d) + _F32(8.5), 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _q_q5_0(x: np.ndarray) -> np.ndarray:
    d = _signed_max(x) / _F32(-16)
    q = _codes(x * _inverse(d) + _F32(16.5), 31)
    qh = np.packbits(q >> 4, axis=1, bitorder="little")
    return np.concatenate([_f16_bytes(d), qh, _pack_nibbles(q)], axis=1)


def _min_range(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / _F32(levels)
    q = _codes((x - lo) * _inverse(d) + _F32(0.5), levels)
    return d, lo, q


def _q_q4_1(x: np.ndarray) -> np.ndarray:
    d, lo, q = _min_range(x, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=1)


def _q_q5_1(x: np.ndarray) -> np.ndarray:
    d, lo, q = _min_range(x, 31)
    qh = np.packbits(q >> 4, axis=1, bitorder="little")
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), qh, _pack_nibbles(q)], axis=1)


def _q_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / _F32(127)
    q = round_half_away(x * _inverse(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_f16_bytes(d), q], axis=1)


_QUANT = {"q4_0": _q_q4_0, "q4_1": _q_q4_1, "q5_0": _q_q5_0, "q5_1": _q_q5_1, "q8_0": _q_q8_0}


def quantize(x: np.ndarray, scheme: str) -> np.ndarray:
    """Encode a float array (rows along the last dim) as flat uint8 blocks of `scheme`."""
    if scheme not in _QUANT:
        raise ValueError(
            f"quantizing to {scheme} is not supported (supported: {', '.join(_QUANT)})"
        )
    elems, _ = BLOCKS[scheme]
    packed_nbytes(scheme, tuple(np.shape(x)))
    blocks = np.asarray(x).astype(_F32).reshape(-1, elems)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.ascontiguousarray(_QUANT[scheme](blocks)).reshape(-1)
