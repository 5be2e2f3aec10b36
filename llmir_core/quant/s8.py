"""The `s8` scheme of llmir's own int8 matmul (`ort.matmul_s8`, ai.llmir MatMulS8 in
llmir_core/targets/onnxruntime/native/matmul_s8.c).

Weights: a logical [N, K] float matrix (HF layout [out, in]) is stored row-major as int8 codes
q = clamp(round_half_even(w / s), -127, 127) with one f32 scale per row s = max|w[n, :]| / 127
(a zero row gets scale 1 and codes 0): `qgemm.quantize_rows` without the pair bound, since the
kernel never adds two products of a code with more than 127 * 127 each into 16 bits.

Activations, rounded once per call in blocks of BLOCK columns (columns past K count as 0):
- at most GEMV_ROWS rows (decode): to int8, d = max|x_block| / 127,
  qx = round_half_even(x * (127 / max|x_block|)) (a zero block: d = 0, codes 0), as llama.cpp's
  q8_0 does; y[m, n] = s[n] * sum_b d[m, b] * sum_{k in b} qx[m, k] * q[n, k];
- more rows (prefill): to 7-bit unsigned codes with a zero point over the block's range
  [lo, hi] = [min(x_block, 0), max(x_block, 0)]: d = (hi - lo) / 127,
  z = clamp(round_half_even(-lo * (127 / (hi - lo))), 0, 127),
  qx = clamp(round_half_even(x * (127 / (hi - lo))) + z, 0, 127) (a zero block: d = 0, z = 0,
  codes 0), so the kernel multiplies unsigned codes by signed ones without the sign trick;
  y[m, n] = s[n] * sum_b d[m, b] * (sum_{k in b} qx[m, k] * q[n, k] - z[m, b] * sum_{k in b} q[n, k]).
"""

from __future__ import annotations

import numpy as np

from . import qgemm

BLOCK = 32  # activation columns per scale
GEMV_ROWS = 4  # rows up to which activations are rounded (the kernel's GEMV path)

_F32 = np.float32


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] float -> (int8 codes [N, K], f32 scales [N]), symmetric per row (max|w| / 127)."""
    return qgemm.quantize_rows(w, pairs=False)


def interleave(codes: np.ndarray) -> np.ndarray:
    """int8 codes [N, K] -> the kernel's layout [ceil(N / 4), ceil(K / BLOCK), 4, BLOCK]: rows in
    groups of 4, each group's rows interleaved by blocks of BLOCK columns (zero-padded), so one
    pass over 4 rows reads one contiguous stream."""
    n, k = codes.shape
    g, nb = -(-n // 4), -(-k // BLOCK)
    out = np.zeros((g * 4, nb * BLOCK), np.int8)
    out[:n, :k] = codes
    return np.ascontiguousarray(out.reshape(g, 4, nb, BLOCK).transpose(0, 2, 1, 3))


def deinterleave(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    """The inverse of `interleave`: int8 codes [n, k]."""
    g, nb = packed.shape[:2]
    return np.ascontiguousarray(packed.transpose(0, 2, 1, 3).reshape(g * 4, nb * BLOCK)[:n, :k])


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[M, K] f32 -> (int8 codes [M, K], f32 scales [M, ceil(K / BLOCK)]) per BLOCK columns."""
    x32 = np.asarray(x, dtype=_F32)
    m, k = x32.shape
    nb = -(-k // BLOCK)
    padded = np.zeros((m, nb * BLOCK), _F32)
    padded[:, :k] = x32
    blocks = padded.reshape(m, nb, BLOCK)
    amax = np.abs(blocks).max(axis=-1)
    inv = np.where(amax > 0, _F32(127) / np.where(amax > 0, amax, _F32(1)), _F32(0)).astype(_F32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8).reshape(m, -1)[:, :k]
    return q, (amax / _F32(127)).astype(_F32)


def quantize_activations_u7(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[M, K] f32 -> (uint8 codes in [0, 127] [M, K], f32 scales and int zero points
    [M, ceil(K / BLOCK)]) per BLOCK columns (the prefill rule)."""
    x32 = np.asarray(x, dtype=_F32)
    m, k = x32.shape
    nb = -(-k // BLOCK)
    padded = np.zeros((m, nb * BLOCK), _F32)
    padded[:, :k] = x32
    blocks = padded.reshape(m, nb, BLOCK)
    lo = np.minimum(blocks.min(axis=-1), _F32(0))
    hi = np.maximum(blocks.max(axis=-1), _F32(0))
    span = (hi - lo).astype(_F32)
    live = span > 0
    inv = np.where(live, _F32(127) / np.where(live, span, _F32(1)), _F32(0)).astype(_F32)
    z = np.where(live, np.clip(np.rint(-lo * inv), 0, 127), 0).astype(np.int64)
    qf = np.clip(np.rint(blocks * inv[..., None]) + z[..., None], 0, 127)
    q = np.where(live[..., None], qf, 0).astype(np.uint8).reshape(m, -1)[:, :k]
    return q, np.where(live, span / _F32(127), _F32(0)).astype(_F32), z


def matmul(a: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """a [..., K] @ (codes * scales)^T as the kernel computes it, in float64."""
    a32 = np.asarray(a, dtype=_F32)
    lead, k = a32.shape[:-1], a32.shape[-1]
    rows = a32.reshape(-1, k)
    s64 = scales.astype(np.float64)
    prefill = rows.shape[0] > GEMV_ROWS
    if prefill:
        qx, d, z = quantize_activations_u7(rows)
    else:
        qx, d = quantize_activations(rows)
    nb = d.shape[1]
    pad = nb * BLOCK - k
    qx = np.pad(qx.astype(np.int64), ((0, 0), (0, pad))).reshape(rows.shape[0], nb, BLOCK)
    qw = np.pad(codes.astype(np.int64), ((0, 0), (0, pad))).reshape(codes.shape[0], nb, BLOCK)
    acc = np.einsum("mbk,nbk->mnb", qx, qw)  # exact integer sums per block
    if prefill:
        acc = acc - z[:, None, :] * qw.sum(-1)[None, :, :]
    out = (acc.astype(np.float64) * d.astype(np.float64)[:, None, :]).sum(-1) * s64
    return out.reshape(*lead, codes.shape[0])
