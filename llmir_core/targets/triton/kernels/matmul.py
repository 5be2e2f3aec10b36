"""Matmul / GEMV with HF [out, in] weights and a fused epilogue: implements `core.matmul`
(transpose_b, weight operand), `llm.linear` and `llm.gated_mlp`'s gate/up half
(`triton.matmul`, `triton.gated_matmul`).

y = act(x @ w^T + bias), or with GATED: act(x @ w_gate^T) * (x @ w_up^T) in one pass over x
(the gated-MLP epilogue: SiLU or GELU times up). f16/bf16 operands accumulate in f32; f32
operands use IEEE f32 dot products (and bf16 ones under TRITON_INTERPRET, whose tl.dot
mishandles bf16: see common.ieee_dot). `gemv_kernel` serves few rows (decode: one token per
sequence, reads each weight row once, coalesced along K); `matmul_kernel` tiles with tl.dot.
ACT: 0 none, 1 silu, 2 gelu (erf), 3 gelu_tanh, 4 relu.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import ACTIVATIONS, AotSpec, cdiv, ieee_dot, pow2


@triton.jit
def _activate(y, ACT: tl.constexpr):
    if ACT == 1:
        y = y / (1.0 + tl.exp(-y))
    elif ACT == 2:
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    elif ACT == 3:
        z = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (1.0 + (1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)))
    elif ACT == 4:
        y = tl.maximum(y, 0.0)
    return y


@triton.jit
def gemv_kernel(
    a_ptr,
    w_ptr,
    wu_ptr,
    bias_ptr,
    c_ptr,
    N,
    K,
    stride_am,
    stride_wn,
    stride_cm,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < K
        a = tl.load(a_ptr + row * stride_am + k, mask=mk, other=0.0).to(tl.float32)
        wm = mn[:, None] & mk[None, :]
        offs = n[:, None].to(tl.int64) * stride_wn + k[None, :]
        w = tl.load(w_ptr + offs, mask=wm, other=0.0).to(tl.float32)
        acc += tl.sum(w * a[None, :], axis=1)
        if GATED:
            wu = tl.load(wu_ptr + offs, mask=wm, other=0.0).to(tl.float32)
            acc_u += tl.sum(wu * a[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mn, other=0.0).to(tl.float32)
    y = _activate(acc, ACT)
    if GATED:
        y = y * acc_u
    tl.store(c_ptr + row * stride_cm + n, y.to(c_ptr.dtype.element_ty), mask=mn)


@triton.jit
def matmul_kernel(
    a_ptr,
    w_ptr,
    wu_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_cm,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = m < M
    mn = n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < K
        a = tl.load(
            a_ptr + m[:, None].to(tl.int64) * stride_am + k[None, :],
            mask=mm[:, None] & mk[None, :],
            other=0.0,
        )
        woffs = n[None, :].to(tl.int64) * stride_wn + k[:, None]
        wmask = mk[:, None] & mn[None, :]
        w = tl.load(w_ptr + woffs, mask=wmask, other=0.0)
        if IEEE:
            a = a.to(tl.float32)
            acc += tl.dot(a, w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, w)
        if GATED:
            wu = tl.load(wu_ptr + woffs, mask=wmask, other=0.0)
            if IEEE:
                acc_u += tl.dot(a, wu.to(tl.float32), input_precision="ieee")
            else:
                acc_u += tl.dot(a, wu)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mn, other=0.0).to(tl.float32)[None, :]
    y = _activate(acc, ACT)
    if GATED:
        y = y * acc_u
    tl.store(
        c_ptr + m[:, None].to(tl.int64) * stride_cm + n[None, :],
        y.to(c_ptr.dtype.element_ty),
        mask=mm[:, None] & mn[None, :],
    )


KERNELS = {"gemv_kernel": gemv_kernel, "matmul_kernel": matmul_kernel}

GEMV_MAX_ROWS = (
    4  # up to this many rows the GEMV kernel runs (one weight pass per row, L2-resident)
)


def blocks(m: int, n: int, k: int) -> dict[str, int]:
    """Launch parameters the lowering records on triton.matmul (gemv when few rows)."""
    return {
        "block_m": 64,
        "block_n": 64,
        "block_k": 32,
        "gemv_block_n": 32,
        "gemv_block_k": min(256, pow2(k, 16)),
    }


def matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    w_up: torch.Tensor | None = None,
    activation: str = "none",
    out: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 32,
    gemv_block_n: int = 32,
    gemv_block_k: int = 128,
    num_warps: int = 4,
) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T (+ bias) -> act(...) [* (x @ w_up^T)] as [..., N]."""
    k = x.shape[-1]
    n = w.shape[0]
    a = x.reshape(-1, k)
    if a.stride(-1) != 1:
        a = a.contiguous()
    rows = a.shape[0]
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device) if out is None else out
    c = out.view(-1, n)
    if rows == 0 or n == 0:
        return out
    gated = w_up is not None
    wu = w_up if gated else w
    bptr = bias if bias is not None else w
    act = ACTIVATIONS[activation]
    if rows <= GEMV_MAX_ROWS:
        gemv_kernel[(rows, cdiv(n, gemv_block_n))](
            a,
            w,
            wu,
            bptr,
            c,
            n,
            k,
            a.stride(0),
            w.stride(0),
            c.stride(0),
            HAS_BIAS=bias is not None,
            GATED=gated,
            ACT=act,
            BLOCK_N=gemv_block_n,
            BLOCK_K=gemv_block_k,
            num_warps=num_warps,
        )
    else:
        matmul_kernel[(cdiv(rows, block_m), cdiv(n, block_n))](
            a,
            w,
            wu,
            bptr,
            c,
            rows,
            n,
            k,
            a.stride(0),
            w.stride(0),
            c.stride(0),
            HAS_BIAS=bias is not None,
            GATED=gated,
            ACT=act,
            IEEE=ieee_dot(x.dtype),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            num_warps=num_warps,
        )
    return out


def aot_specs(dtype: str) -> list[AotSpec]:
    ptrs = {"a_ptr": dtype, "w_ptr": dtype, "wu_ptr": dtype, "bias_ptr": dtype, "c_ptr": dtype}
    out = []
    for gated, act in ((False, 0), (True, 1), (True, 3)):
        out.append(
            AotSpec(
                "gemv_kernel",
                ptrs,
                {"HAS_BIAS": False, "GATED": gated, "ACT": act, "BLOCK_N": 32, "BLOCK_K": 256},
            )
        )
        out.append(
            AotSpec(
                "matmul_kernel",
                ptrs,
                {
                    "HAS_BIAS": False,
                    "GATED": gated,
                    "ACT": act,
                    "IEEE": dtype == "fp32",
                    "BLOCK_M": 64,
                    "BLOCK_N": 64,
                    "BLOCK_K": 32,
                },
            )
        )
    return out
