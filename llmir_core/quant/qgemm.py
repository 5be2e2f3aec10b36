"""The `qgemm` scheme: int8 weights per output channel with activations quantized to uint8 at run
time, as onnxruntime's `com.microsoft.DynamicQuantizeMatMul` computes it (MLAS QGEMM).

Weights: a logical [N, K] float matrix (HF layout [out, in]) is stored as int8 codes
q = clamp(round_half_even(w / s), -L, L) with one f32 scale per row s = max|w[n, :]| / L
(L = 127, or 63 for 7-bit codes; a zero row gets scale 1 and codes 0). onnxruntime takes B as [K, N]: the codes
transposed, the scales as `b_scale` [N].

Activations (the ONNX DynamicQuantizeLinear rule, per tensor): lo = min(min(a), 0),
hi = max(max(a), 0), scale = (hi - lo) / 255, zero = clamp(round_half_even(-lo / scale), 0, 255),
qa = clamp(round_half_even(a / scale) + zero, 0, 255) (a zero tensor: scale 1, zero 0).

Result: y[m, n] = sum_k (qa[m, k] - zero) * q[n, k] * (scale * s[n]), the integer sum exact.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32


def quantize_rows(w: np.ndarray, top: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] float -> (int8 codes [N, K] within +-top, f32 scales [N]), symmetric per row."""
    w32 = np.asarray(w, dtype=_F32)
    amax = np.abs(w32).max(axis=-1) if w32.shape[-1] else np.zeros(w32.shape[:-1], _F32)
    scales = (amax / _F32(top)).astype(_F32)
    scales = np.where(scales > 0, scales, _F32(1)).astype(_F32)
    q = np.clip(np.rint(w32 / scales[..., None]), -top, top).astype(np.int8)
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
