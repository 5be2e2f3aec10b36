"""The `qgemm` scheme: int8 weights per output channel with activations quantized to uint8 at run
time, as onnxruntime's `com.microsoft.DynamicQuantizeMatMul` computes it (MLAS QGEMM).

Weights: a logical [N, K] float matrix (HF layout [out, in]) is stored as int8 codes
q = clamp(round_half_even(w / s), -127, 127) with one f32 scale per row s = m / 127, where m is
max|w[n, :]| ("u8" storage: code + 128 with zero point 128, MLAS's u8u8 kernel) or, "s8pair",
the largest |w[n, 2i]| + |w[n, 2i + 1]| (a zero row gets scale 1 and codes 0). The pair bound
keeps every adjacent pair's |q| sum <= 128 after rounding, so MLAS's u8s8 kernels, whose AVX2
and AVX-512 (non-VNNI) forms add u8 x s8 products in pairs into saturating 16-bit lanes
(vpmaddubsw: 255 * 128 = 32640 < 32767), compute the exact sum; for Gaussian rows the pair
bound costs about 1.4x the rounding error of a max|w| scale, for heavy-tailed rows about 1.05x. onnxruntime takes B as [K, N]: the codes
transposed, the scales as `b_scale` [N].

Activations (the ONNX DynamicQuantizeLinear rule, per tensor): lo = min(min(a), 0),
hi = max(max(a), 0), scale = (hi - lo) / 255, zero = clamp(round_half_even(-lo / scale), 0, 255),
qa = clamp(round_half_even(a / scale) + zero, 0, 255) (a zero tensor: scale 1, zero 0).

Result: y[m, n] = sum_k (qa[m, k] - zero) * q[n, k] * (scale * s[n]), the integer sum exact.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32


def quantize_rows(w: np.ndarray, pairs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] float -> (int8 codes [N, K], f32 scales [N]), symmetric per row. pairs: bound the
    sum of magnitudes of each adjacent pair (k = 2i, 2i + 1) of codes by 128 instead of each
    code by 127 (scale = the largest pair sum / 127)."""
    w32 = np.asarray(w, dtype=_F32)
    n, k = w32.shape
    mag = np.abs(w32)
    if pairs:
        padded = np.concatenate([mag, np.zeros((n, k % 2), _F32)], axis=1)
        mag = padded.reshape(n, -1, 2).sum(axis=-1, dtype=_F32)
    amax = mag.max(axis=-1) if mag.shape[-1] else np.zeros(n, _F32)
    scales = (amax / _F32(127)).astype(_F32)
    scales = np.where(scales > 0, scales, _F32(1)).astype(_F32)
    q = np.clip(np.rint(w32 / scales[:, None]), -127, 127).astype(np.int8)
    return q, scales


def dequantize_rows(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The f32 weight the codes stand for."""
    return (codes.astype(_F32) * scales.astype(_F32)[..., None]).astype(_F32)


def quantize_activations(a: np.ndarray) -> tuple[np.ndarray, float, int]:
    """DynamicQuantizeLinear of a whole tensor: (uint8 codes, scale, zero point)."""
    a32 = np.asarray(a, dtype=_F32)
    lo = min(float(a32.min()), 0.0) if a32.size else 0.0
    hi = max(float(a32.max()), 0.0) if a32.size else 0.0
    scale = _F32((_F32(hi) - _F32(lo)) / _F32(255))
    if scale == 0:
        return np.zeros(a32.shape, np.uint8), 1.0, 0
    zero = int(np.clip(np.rint(-_F32(lo) / scale), 0, 255))
    q = np.clip(np.rint(a32 / scale) + zero, 0, 255).astype(np.uint8)
    return q, float(scale), zero


def matmul(a: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """a [..., K] @ (codes * scales)^T with a quantized at run time, in float64."""
    qa, sa, za = quantize_activations(a)
    acc = (qa.astype(np.int64) - za) @ codes.astype(np.int64).T  # exact integer sums
    return acc.astype(np.float64) * (sa * scales.astype(np.float64))
