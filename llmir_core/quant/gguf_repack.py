"""GGUF blocks repacked for MatMulNBits-style storage (codes + per-block float scales).

Formats whose value is `scale * q` with a symmetric integer q (LOSSLESS) repack exactly:
code = q + 2**(bits-1) and the block scale kept as float32, so `nbits.dequantize` gives gguf's
values bit for bit. Formats with a per-block float minimum (REQUANT) have no such form and are
requantized to blocks with zero points at the (bits, block) listed.
"""

from __future__ import annotations

import numpy as np

from . import gguf_blocks, nbits

LOSSLESS: dict[str, tuple[int, int]] = {
    "q4_0": (4, 32),
    "q8_0": (8, 32),
    "q5_0": (8, 32),
    "q6_k": (8, 16),
    "q3_k": (4, 16),
}
REQUANT: dict[str, tuple[int, int]] = {
    "q4_1": (4, 32),
    "q4_k": (4, 32),
    "q2_k": (4, 16),
    "q5_1": (8, 32),
    "q5_k": (8, 32),
    "iq4_nl": (4, 32),
    "iq4_xs": (4, 32),
}


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def gguf_block_scales(raw: np.ndarray, scheme: str) -> np.ndarray:
    """Per-(sub)block float32 scales of lossless-repackable GGUF blocks ([n_blocks, bytes])."""
    if scheme in ("q4_0", "q8_0", "q5_0"):
        return _f16(raw[:, 0:2])
    if scheme == "q6_k":
        return _f16(raw[:, 208:210]) * np.ascontiguousarray(raw[:, 192:208]).view(np.int8).astype(
            np.float32
        )
    if scheme == "q3_k":
        n = raw.shape[0]
        s = raw[:, 96:108]
        low = np.concatenate([s[:, :8] & 0x0F, s[:, :8] >> 4], axis=1)
        high = (
            s[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8)[None, :, None]
        ).reshape(n, 16) & 3
        sc = (low | (high << 4)).astype(np.int8) - np.int8(32)
        return _f16(raw[:, 108:110]) * sc.astype(np.float32)
    raise ValueError(f"{scheme} has no lossless MatMulNBits form")


def repack_gguf(
    raw_rows: np.ndarray, scheme: str, cols: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Losslessly repack GGUF rows ([n, row_bytes] uint8): (codes [n, cols*bits/8], scales
    [n, cols/block] f32, bits, block); nbits.dequantize gives exactly gguf's values."""
    bits, block = LOSSLESS[scheme]
    n = raw_rows.shape[0]
    _, nbytes = gguf_blocks.BLOCKS[scheme]
    x = gguf_blocks.dequantize(raw_rows, scheme, (n, cols)).reshape(n, cols // block, block)
    scales = gguf_block_scales(np.ascontiguousarray(raw_rows).reshape(-1, nbytes), scheme).reshape(
        n, cols // block
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scales[..., None] != 0, np.rint(x / scales[..., None]), 0)
    codes = (q + (1 << (bits - 1))).astype(np.uint8).reshape(n, cols)
    return nbits.pack_codes(codes, bits), scales.astype(np.float32), bits, block


__all__ = ["LOSSLESS", "REQUANT", "gguf_block_scales", "repack_gguf"]
