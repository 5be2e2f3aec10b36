"""Int32-packed weight formats of vLLM-ecosystem checkpoints: GPTQ, AWQ (GEMM) and
compressed-tensors pack-quantized, kept packed as the checkpoint stores them.

Every scheme describes a logical weight W of shape [N, K] (HF layout [out, in]) quantized to
`bits` in {2, 4, 8} with groups of `block` consecutive input columns (G = K / block groups; a
per-channel checkpoint has block = K), or with an explicit group index per input column
(`g_idx`, GPTQ's act-order / desc_act). `pf = 32 / bits` codes share one little-endian int32,
lowest bits first. The raw bytes of the packed weight are the PackedArray's data.

- `gptq` (AutoGPTQ / GPTQModel `checkpoint_format` "gptq"): qweight int32 [K/pf, N], packed along
  K (word r holds input columns r*pf .. r*pf+pf-1); scales [G, N]; qzeros int32 [G, N/pf], packed
  along N. The v1 format stores zero - 1: the effective zero is stored + 1 (1 .. 2**bits).
  `gptq_v2` (`checkpoint_format` "gptq_v2") stores the zero as is.
- `awq` (AutoAWQ version "gemm", 4 bits): qweight int32 [K, N/pf], packed along N in the
  interleaved order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds output column c*8 + ORDER[i]);
  qzeros int32 [G, N/pf] in the same order; scales [G, N]; the zero is used as stored.
- `ctpack` (compressed-tensors "pack-quantized"): weight_packed int32 [N, K/pf], packed along K;
  codes are the signed values plus 2**(bits-1); weight_scale [N, G]; for asymmetric weights
  weight_zero_point int32 [ceil(N/pf), G], packed along N (dim 0) the same way; symmetric
  weights have zero 2**(bits-1) in code space.

Dequantization (all schemes), in float32: W[n, k] = (code[n, k] - zero[n, g]) * scale[n, g] with
g = g_idx[k] (default k // block). The product of a small integer and an f16/bf16 scale is exact
in float32, so the result is exactly the value the checkpoint's own float formula gives before
any rounding to the model dtype.
"""

from __future__ import annotations

import numpy as np

SCHEMES = ("gptq", "gptq_v2", "awq", "ctpack")
SUPPORTED_BITS = (2, 4, 8)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_F32 = np.float32


def _pf(bits: int) -> int:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"int32-packed formats support bits {SUPPORTED_BITS}, got {bits}")
    return 32 // bits


# -- packing along an axis ----------------------------------------------------------------------


def pack_int32(codes: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unsigned codes < 2**bits -> int32, `32/bits` consecutive codes along `axis` per word,
    lowest bits first (the axis length must be a multiple of 32/bits)."""
    pf = _pf(bits)
    c = np.moveaxis(np.asarray(codes).astype(np.uint32), axis, -1)
    if c.shape[-1] % pf:
        raise ValueError(f"packed dim {c.shape[-1]} is not a multiple of {pf}")
    c = c.reshape(*c.shape[:-1], -1, pf)
    shifts = np.arange(pf, dtype=np.uint32) * np.uint32(bits)
    words = np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint32)
    return np.moveaxis(words.view(np.int32), -1, axis)


def unpack_int32(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Inverse of pack_int32: int32 words -> uint8 codes, 32/bits times longer along `axis`."""
    pf = _pf(bits)
    w = np.moveaxis(np.asarray(words).view(np.uint32), axis, -1)
    shifts = np.arange(pf, dtype=np.uint32) * np.uint32(bits)
    c = (w[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    c = c.reshape(*w.shape[:-1], -1).astype(np.uint8)
    return np.moveaxis(c, -1, axis)


def _awq_perm(n: int) -> np.ndarray:
    """Storage position of each output column: nibble i of word c holds column c*8 + ORDER[i]."""
    order = np.asarray(AWQ_ORDER)
    return (np.arange(n).reshape(-1, 8)[:, order]).reshape(-1)


# -- layouts --------------------------------------------------------------------------------------


def shapes(scheme: str, bits: int, n: int, k: int, block: int) -> dict[str, tuple[int, ...]]:
    """The stored shapes of (packed, scales, zeros) for a logical [n, k] weight."""
    pf = _pf(bits)
    g = -(-k // block)
    if scheme in ("gptq", "gptq_v2"):
        return {"packed": (k // pf, n), "scales": (g, n), "zeros": (g, -(-n // pf))}
    if scheme == "awq":
        return {"packed": (k, n // pf), "scales": (g, n), "zeros": (g, n // pf)}
    if scheme == "ctpack":
        return {"packed": (n, k // pf), "scales": (n, g), "zeros": (-(-n // pf), g)}
    raise ValueError(f"unknown int32-packed scheme '{scheme}'")


def check_layout(scheme: str, bits: int, n: int, k: int, block: int) -> str | None:
    """Why [n, k] cannot be stored in this scheme, or None."""
    pf = _pf(bits)
    if scheme == "awq" and bits != 4:
        return "AWQ GEMM packing is defined for 4 bits only"
    if scheme in ("gptq", "gptq_v2", "ctpack") and k % pf:
        return f"the input dim {k} is not a multiple of {pf}"
    if scheme in ("gptq", "gptq_v2", "awq") and n % pf:
        return f"the output dim {n} is not a multiple of {pf}"
    if block <= 0:
        return f"group size {block} is not positive"
    return None


def codes(scheme: str, raw: np.ndarray, bits: int, shape: tuple[int, int]) -> np.ndarray:
    """The unsigned codes [N, K] of a packed weight's raw bytes."""
    n, k = shape
    words = (
        np.ascontiguousarray(raw).view(np.int32).reshape(shapes(scheme, bits, n, k, k)["packed"])
    )
    if scheme in ("gptq", "gptq_v2"):
        return unpack_int32(words, bits, 0).T
    if scheme == "awq":
        stored = unpack_int32(words, bits, 1)  # [K, N] in storage order
        out = np.empty_like(stored)
        out[:, _awq_perm(n)] = stored
        return out.T
    return unpack_int32(words, bits, 1)


def zeros(scheme: str, zp: np.ndarray | None, bits: int, n: int, groups: int) -> np.ndarray:
    """Effective zero points [N, G] in code space (float32)."""
    if zp is None:
        return np.full((n, groups), _F32(1 << (bits - 1)))
    z = np.asarray(zp).view(np.int32)
    if scheme in ("gptq", "gptq_v2"):
        u = unpack_int32(z, bits, 1)[:, :n].T.astype(_F32)
        return u + _F32(1) if scheme == "gptq" else u
    if scheme == "awq":
        stored = unpack_int32(z, bits, 1)
        out = np.empty_like(stored)
        out[:, _awq_perm(n)] = stored
        return out.T.astype(_F32)
    return unpack_int32(z, bits, 0)[:n].astype(_F32)


def group_index(k: int, block: int, g_idx: np.ndarray | None) -> np.ndarray:
    return (
        np.arange(k) // block if g_idx is None else np.asarray(g_idx).astype(np.int64).reshape(-1)
    )


def dequantize(
    scheme: str,
    raw: np.ndarray,
    scales: np.ndarray,
    zp: np.ndarray | None,
    g_idx: np.ndarray | None,
    bits: int,
    block: int,
    shape: tuple[int, int],
) -> np.ndarray:
    """Float32 [N, K] of a packed weight (see the module docstring for the formula)."""
    n, k = shape
    why = check_layout(scheme, bits, n, k, block)
    if why:
        raise ValueError(why)
    groups = -(-k // block)
    q = codes(scheme, raw, bits, shape).astype(_F32)
    s = np.asarray(scales).astype(_F32)
    s = s.T if scheme != "ctpack" else s  # -> [N, G]
    z = zeros(scheme, zp, bits, n, groups)
    gi = group_index(k, block, g_idx)
    if gi.shape != (k,) or (gi.size and (gi.min() < 0 or gi.max() >= s.shape[1])):
        raise ValueError(f"g_idx must hold {k} group numbers in 0 .. {s.shape[1] - 1}")
    return ((q - z[:, gi]) * s[:, gi]).astype(_F32)


# -- to onnxruntime MatMulNBits (the nbits layout) ------------------------------------------------


def nbits_block_ok(block: int, k: int) -> bool:
    """MatMulNBits takes power-of-two blocks >= 16 that divide K."""
    return block >= 16 and block & (block - 1) == 0 and k % block == 0


def lossless_nbits(
    scheme: str,
    bits: int,
    block: int,
    shape: tuple[int, int],
    zp: np.ndarray | None,
    g_idx: np.ndarray | None,
) -> str | None:
    """Why the weight has no exact MatMulNBits form (None: it has one). Needs only the small
    tensors (zero points, g_idx), not the packed weight."""
    n, k = shape
    if bits not in (4, 8):
        return f"MatMulNBits on CPU takes 4 or 8 bits, not {bits}"
    if not nbits_block_ok(block, k):
        return f"group size {block} is not a power of two >= 16 dividing {k}"
    if g_idx is not None and not np.array_equal(
        group_index(k, block, g_idx), np.arange(k) // block
    ):
        return "act-order g_idx (groups are not consecutive input columns)"
    z = zeros(scheme, zp, bits, n, k // block)
    if z.max() > (1 << bits) - 1:
        return f"a zero point of {int(z.max())} does not fit {bits} bits"
    return None


def to_nbits(
    scheme: str,
    raw: np.ndarray,
    scales: np.ndarray,
    zp: np.ndarray | None,
    bits: int,
    block: int,
    shape: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Exact nbits form of a weight `lossless_nbits` accepts: (codes bytes [N, K*bits/8],
    float32 scales [N, K/block], packed u8 zero points or None when every zero is the midpoint)."""
    from .nbits import pack_codes

    n, k = shape
    q = codes(scheme, raw, bits, shape)
    s = np.asarray(scales).astype(_F32)
    s = s.T if scheme != "ctpack" else s
    z = zeros(scheme, zp, bits, n, k // block)
    mid = 1 << (bits - 1)
    zpk = None if np.all(z == mid) else pack_codes(z.astype(np.uint8), bits, mid)
    return pack_codes(q, bits), np.ascontiguousarray(s), zpk


# -- packers (writing checkpoints: the tests, and a reference for the layout) ---------------------


def quantize_groups(
    w: np.ndarray,
    bits: int,
    block: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    g_idx: np.ndarray | None = None,
    min_zero: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ-style round-to-nearest of float [N, K] per group: (unsigned codes [N, K],
    scales [N, G] in scale_dtype, integer zeros [N, G] in min_zero .. 2**bits - 1)."""
    w = np.asarray(w, _F32)
    n, k = w.shape
    gi = group_index(k, block, g_idx)
    groups = int(gi.max()) + 1
    maxq = (1 << bits) - 1
    s = np.zeros((n, groups), _F32)
    z = np.zeros((n, groups), _F32)
    for g in range(groups):
        cols = w[:, gi == g]
        lo, hi = np.minimum(cols.min(axis=1), 0), np.maximum(cols.max(axis=1), 0)
        if symmetric:
            m = np.maximum(np.abs(lo), hi)
            sc = np.where(m > 0, 2 * m / maxq, 1).astype(scale_dtype).astype(_F32)
            zz = np.full(n, _F32((maxq + 1) // 2))
        else:
            sc = np.where(hi > lo, (hi - lo) / maxq, 1).astype(scale_dtype).astype(_F32)
            zz = np.clip(np.round(-lo / sc), min_zero, maxq)
        s[:, g], z[:, g] = sc, zz
    q = np.clip(np.round(w / s[:, gi] + z[:, gi]), 0, maxq).astype(np.uint8)
    return q, s.astype(scale_dtype), z.astype(np.int64)


def pack(
    scheme: str, q: np.ndarray, scales: np.ndarray, zero: np.ndarray | None, bits: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Codes [N, K], scales [N, G], integer zeros [N, G] (None: symmetric ctpack) -> the
    checkpoint's (packed weight, scales, packed zeros) arrays in the scheme's layout."""
    n = q.shape[0]
    if scheme in ("gptq", "gptq_v2"):
        assert zero is not None
        stored = zero - 1 if scheme == "gptq" else zero
        if stored.min() < 0:
            raise ValueError("GPTQ v1 cannot store a zero point of 0 (it stores zero - 1)")
        return (
            pack_int32(q.T, bits, 0),
            np.ascontiguousarray(scales.T),
            pack_int32(stored.T, bits, 1),
        )
    if scheme == "awq":
        assert zero is not None
        perm = _awq_perm(n)
        return (
            pack_int32(q.T[:, perm], bits, 1),
            np.ascontiguousarray(scales.T),
            pack_int32(zero.T[:, perm], bits, 1),
        )
    zp = None
    if zero is not None:
        pf = 32 // bits
        pad = (-n) % pf
        zpad = (
            np.concatenate([zero, np.full((pad, zero.shape[1]), 1 << (bits - 1))]) if pad else zero
        )
        zp = pack_int32(zpad, bits, 0)
    return pack_int32(q, bits, 1), np.ascontiguousarray(scales), zp


__all__ = [
    "SCHEMES",
    "AWQ_ORDER",
    "pack_int32",
    "unpack_int32",
    "shapes",
    "check_layout",
    "codes",
    "zeros",
    "dequantize",
    "quantize_groups",
    "pack",
    "group_index",
    "lossless_nbits",
    "to_nbits",
    "nbits_block_ok",
]
