"""Block quantization: GGUF block formats (`gguf_blocks`), MatMulNBits packing (`nbits`) and
the int32-packed checkpoint formats GPTQ/AWQ/compressed-tensors (`int32_packed`).

`quantize`/`dequantize` work on `PackedArray`s (raw bytes + QuantType + logical shape) so the
`llm.quantize`/`llm.dequantize` ops and weight loaders share one implementation. Nothing here
imports gguf or onnxruntime.
"""

from __future__ import annotations

import numpy as np

from llmir_core.ir.types import QuantType, numpy_dtype
from llmir_core.weights import PackedArray

from . import gguf_blocks, int32_packed, nbits


def quantize(
    x: np.ndarray, qtype: QuantType
) -> tuple[PackedArray, np.ndarray | None, np.ndarray | None]:
    """Encode floats as `qtype`: (packed, scales, zero points); the last two only for nbits."""
    shape = tuple(int(s) for s in np.shape(x))
    if qtype.scheme == "nbits":
        codes, scales, zp = nbits.quantize(
            x, qtype.bits, qtype.block, qtype.zero == "none", numpy_dtype(qtype.scale)
        )
        return PackedArray(codes, qtype, shape), scales, zp
    return PackedArray(gguf_blocks.quantize(x, qtype.scheme), qtype, shape), None, None


def dequantize(
    packed: PackedArray,
    scales: np.ndarray | None = None,
    zero_points: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
) -> np.ndarray:
    """Decode to float32 of the packed array's logical shape."""
    q = packed.qtype
    if q.scheme in int32_packed.SCHEMES:
        if scales is None:
            raise ValueError(f"{q.scheme} data needs its scales")
        n, k = packed.shape
        return int32_packed.dequantize(
            q.scheme, packed.data, scales, zero_points, g_idx, q.bits, q.block, (n, k)
        )
    if g_idx is not None:
        raise ValueError("g_idx applies to the int32-packed checkpoint formats only")
    if q.scheme == "nbits":
        if scales is None:
            raise ValueError("nbits data needs its scales")
        return nbits.dequantize(packed.data, scales, zero_points, q.bits, q.block, packed.shape)
    if scales is not None or zero_points is not None:
        raise ValueError(f"{q.scheme} blocks carry their own scales; pass none")
    return gguf_blocks.dequantize(packed.data, q.scheme, packed.shape)


__all__ = ["quantize", "dequantize", "gguf_blocks", "int32_packed", "nbits"]
