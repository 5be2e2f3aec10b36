"""Weight-only int8/int4 GEMV and GEMM: implements `llm.quantized_matmul` (`triton.q_matmul`)
for GGUF Q8_0/Q4_0 blocks and symmetric nbits weights, repacked once at build time, losslessly.

Layout the kernels read (see `repack_gguf` / `repack_nbits`): codes [N, K*BITS/8] and scales
[N, K/QBLOCK] (f16 for GGUF: the blocks' own half-precision scales; the nbits scale dtype
otherwise). BITS=8: signed codes, w = code * scale. BITS=4: unsigned nibbles, w = (nib - 8) *
scale; with GGUF_ORDER byte j of each 32-element block holds elements j (low nibble) and j + 16
(high nibble), as in GGUF files; otherwise byte i holds elements 2i (low) and 2i + 1 (high), as
MatMulNBits. Accumulation is f32; the epilogue (bias, activation) is the matmul kernels'.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import ACTIVATIONS, AotSpec, cdiv
from llmir_core.targets.triton.kernels.matmul import GEMV_MAX_ROWS, _activate


@triton.jit
def _dequant_tile(
    q_ptr,
    s_ptr,
    n,
    k,
    mask,
    stride_qn,
    stride_sn,
    BITS: tl.constexpr,
    QBLOCK: tl.constexpr,
    GGUF_ORDER: tl.constexpr,
):
    """w[n, k] for index tensors n, k of one shape (f32)."""
    n64 = n.to(tl.int64)
    if BITS == 8:
        code = tl.load(q_ptr + n64 * stride_qn + k, mask=mask, other=0).to(tl.float32)
    else:
        if GGUF_ORDER:
            within = k % 32
            byte = (k // 32) * 16 + within % 16
            shift = (within // 16) * 4
        else:
            byte = k // 2
            shift = (k % 2) * 4
        b = tl.load(q_ptr + n64 * stride_qn + byte, mask=mask, other=0).to(tl.int32)
        code = ((b >> shift) & 15).to(tl.float32) - 8.0
    s = tl.load(s_ptr + n64 * stride_sn + k // QBLOCK, mask=mask, other=0.0).to(tl.float32)
    return code * s


@triton.jit
def qgemv_kernel(
    a_ptr,
    q_ptr,
    s_ptr,
    bias_ptr,
    c_ptr,
    N,
    K,
    stride_am,
    stride_qn,
    stride_sn,
    stride_cm,
    BITS: tl.constexpr,
    QBLOCK: tl.constexpr,
    GGUF_ORDER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < K
        a = tl.load(a_ptr + row * stride_am + k, mask=mk, other=0.0).to(tl.float32)
        nn = n[:, None] + k[None, :] * 0
        kk = k[None, :] + n[:, None] * 0
        w = _dequant_tile(
            q_ptr,
            s_ptr,
            nn,
            kk,
            mn[:, None] & mk[None, :],
            stride_qn,
            stride_sn,
            BITS,
            QBLOCK,
            GGUF_ORDER,
        )
        acc += tl.sum(w * a[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mn, other=0.0).to(tl.float32)
    y = _activate(acc, ACT)
    tl.store(c_ptr + row * stride_cm + n, y.to(c_ptr.dtype.element_ty), mask=mn)


@triton.jit
def qmatmul_kernel(
    a_ptr,
    q_ptr,
    s_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_qn,
    stride_sn,
    stride_cm,
    BITS: tl.constexpr,
    QBLOCK: tl.constexpr,
    GGUF_ORDER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = m < M
    mn = n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < K
        a = tl.load(
            a_ptr + m[:, None].to(tl.int64) * stride_am + k[None, :],
            mask=mm[:, None] & mk[None, :],
            other=0.0,
        ).to(tl.float32)
        nn = n[None, :] + k[:, None] * 0
        kk = k[:, None] + n[None, :] * 0
        w = _dequant_tile(
            q_ptr,
            s_ptr,
            nn,
            kk,
            mk[:, None] & mn[None, :],
            stride_qn,
            stride_sn,
            BITS,
            QBLOCK,
            GGUF_ORDER,
        )
        acc += tl.dot(a, w, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mn, other=0.0).to(tl.float32)[None, :]
    y = _activate(acc, ACT)
    tl.store(
        c_ptr + m[:, None].to(tl.int64) * stride_cm + n[None, :],
        y.to(c_ptr.dtype.element_ty),
        mask=mm[:, None] & mn[None, :],
    )


KERNELS = {"qgemv_kernel": qgemv_kernel, "qmatmul_kernel": qmatmul_kernel}

GGUF_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}


def repack_gguf(raw: np.ndarray, scheme: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q8_0/Q4_0 rows (raw bytes, n*k/32 blocks) -> (codes [n, k*bits/8], scales f16 [n, k/32]).
    Lossless: the blocks' bytes are only regrouped (scales and codes are the file's own)."""
    if scheme not in GGUF_BLOCK_BYTES:
        raise ValueError(f"the triton kernels read GGUF q8_0 and q4_0 blocks, not {scheme}")
    if k % 32:
        raise ValueError(f"GGUF rows of {k} elements are not whole 32-element blocks")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // 32, GGUF_BLOCK_BYTES[scheme])
    scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(n, k // 32)
    codes = np.ascontiguousarray(blocks[:, :, 2:]).reshape(n, -1)
    if scheme == "q8_0":
        codes = codes.view(np.int8)
    return codes, scales


def repack_nbits(
    codes: np.ndarray, scales: np.ndarray, bits: int, n: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric nbits (zero point 2**(bits-1)) -> the kernels' layout: 4-bit codes unchanged,
    8-bit codes shifted to signed (code - 128), losslessly."""
    c = np.ascontiguousarray(codes, dtype=np.uint8).reshape(n, -1)
    if bits == 8:
        c = (c.astype(np.int16) - 128).astype(np.int8)
    elif bits != 4:
        raise ValueError(f"the triton kernels read 4- and 8-bit nbits weights, not {bits}-bit")
    return c, np.ascontiguousarray(scales).reshape(n, -1)


def q_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    bits: int,
    qblock: int,
    gguf_order: bool,
    activation: str = "none",
    out: torch.Tensor | None = None,
    block_m: int = 32,
    block_n: int = 64,
    block_k: int = 64,
    gemv_block_n: int = 32,
    gemv_block_k: int = 128,
    num_warps: int = 4,
) -> torch.Tensor:
    """x [..., K] @ dequant(codes, scales)[N, K]^T (+ bias), activation -> [..., N]."""
    k = x.shape[-1]
    n = codes.shape[0]
    a = x.reshape(-1, k).contiguous()
    rows = a.shape[0]
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device) if out is None else out
    c = out.view(-1, n)
    if rows == 0:
        return out
    bptr = bias if bias is not None else scales
    common = dict(
        BITS=bits,
        QBLOCK=qblock,
        GGUF_ORDER=gguf_order,
        HAS_BIAS=bias is not None,
        ACT=ACTIVATIONS[activation],
        num_warps=num_warps,
    )
    if rows <= GEMV_MAX_ROWS:
        qgemv_kernel[(rows, cdiv(n, gemv_block_n))](
            a,
            codes,
            scales,
            bptr,
            c,
            n,
            k,
            a.stride(0),
            codes.stride(0),
            scales.stride(0),
            c.stride(0),
            BLOCK_N=gemv_block_n,
            BLOCK_K=gemv_block_k,
            **common,
        )
    else:
        qmatmul_kernel[(cdiv(rows, block_m), cdiv(n, block_n))](
            a,
            codes,
            scales,
            bptr,
            c,
            rows,
            n,
            k,
            a.stride(0),
            codes.stride(0),
            scales.stride(0),
            c.stride(0),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            **common,
        )
    return out


def aot_specs(dtype: str) -> list[AotSpec]:
    out = []
    for bits in (8, 4):
        ptrs = {
            "a_ptr": dtype,
            "q_ptr": "i8" if bits == 8 else "u8",
            "s_ptr": "fp16",
            "bias_ptr": dtype,
            "c_ptr": dtype,
        }
        base = {"BITS": bits, "QBLOCK": 32, "GGUF_ORDER": True, "HAS_BIAS": False, "ACT": 0}
        out.append(AotSpec("qgemv_kernel", ptrs, {**base, "BLOCK_N": 32, "BLOCK_K": 128}))
        out.append(
            AotSpec("qmatmul_kernel", ptrs, {**base, "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64})
        )
    return out
