"""The panel layout of an f32 matmul weight (`ort.matmul_f32 {layout = "panel16"}`, ai.llmir
MatMulF32 in llmir_core/targets/onnxruntime/native/matmul_f32.c): the logical weight W [N, K] (y = x @ W^T)
stored as [ceil(N/16), K, 16] with P[p, k, c] = W[16p + c, k] and rows past N zero. It is the
GEMM's packed-B layout, so the kernel multiplies panels straight from the mapped file and a
decode step streams each panel front to back."""

from __future__ import annotations

import numpy as np

PANEL = 16  # weight rows per panel
LAYOUTS = ("rows", "panel16")  # ort.matmul_f32's `layout`


def panel_shape(n: int, k: int) -> tuple[int, int, int]:
    """The stored shape of an [n, k] weight in panels."""
    return (-(-n // PANEL), k, PANEL)


def to_panels(w: np.ndarray) -> np.ndarray:
    """W [N, K] -> [ceil(N/16), K, 16] (zero-padded rows), f32."""
    n, k = w.shape
    p = panel_shape(n, k)[0]
    padded = np.zeros((p * PANEL, k), np.float32)
    padded[:n] = w
    return np.ascontiguousarray(padded.reshape(p, PANEL, k).transpose(0, 2, 1))


def from_panels(panels: np.ndarray, n: int) -> np.ndarray:
    """[ceil(N/16), K, 16] -> W [N, K]."""
    p, k, c = panels.shape
    return np.ascontiguousarray(panels.transpose(0, 2, 1).reshape(p * c, k)[:n])


__all__ = ["LAYOUTS", "PANEL", "from_panels", "panel_shape", "to_panels"]
