"""Rotary position embedding: implements `llm.rotary_embedding` (`triton.rotary`), half-split
(GPT-NeoX/llama) and interleaved (GPT-J) pairs, partial `rotary_dim` (the tail is copied).

One program per (batch, seq) row and head; positions are read from device memory (so a CUDA
graph replays it at each new position); in place (out = x) is allowed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import AotSpec, pow2


@triton.jit
def rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    out_ptr,
    seq,
    stride_xb,
    stride_xh,
    stride_xs,
    stride_ob,
    stride_oh,
    stride_os,
    pos_stride_b,
    head_dim,
    half,
    cos_stride,
    INTERLEAVED: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bs = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = (bs // seq).to(tl.int64)
    s = (bs % seq).to(tl.int64)
    pos = tl.load(pos_ptr + b * pos_stride_b + s).to(tl.int64)
    xb = x_ptr + b * stride_xb + h * stride_xh + s * stride_xs
    ob = out_ptr + b * stride_ob + h * stride_oh + s * stride_os
    i = tl.arange(0, BLOCK_HALF)
    mh = i < half
    c = tl.load(cos_ptr + pos * cos_stride + i, mask=mh, other=0.0).to(tl.float32)
    sn = tl.load(sin_ptr + pos * cos_stride + i, mask=mh, other=0.0).to(tl.float32)
    if INTERLEAVED:
        i1 = 2 * i
        i2 = 2 * i + 1
    else:
        i1 = i
        i2 = i + half
    x1 = tl.load(xb + i1, mask=mh, other=0.0).to(tl.float32)
    x2 = tl.load(xb + i2, mask=mh, other=0.0).to(tl.float32)
    d = tl.arange(0, BLOCK_D)
    mt = (d >= 2 * half) & (d < head_dim)
    tail = tl.load(xb + d, mask=mt, other=0.0)
    ty = out_ptr.dtype.element_ty
    tl.store(ob + i1, (c * x1 - sn * x2).to(ty), mask=mh)
    tl.store(ob + i2, (sn * x1 + c * x2).to(ty), mask=mh)
    tl.store(ob + d, tail.to(ty), mask=mt)


KERNELS = {"rotary_kernel": rotary_kernel}


def rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    *,
    interleaved: bool = False,
    rotary_dim: int = 0,
    out: torch.Tensor | None = None,
    num_warps: int = 1,
) -> torch.Tensor:
    """x [batch, heads, seq, head_dim] (any strides, last dim contiguous); positions [batch|1, seq]."""
    b, h, s, d = x.shape
    rd = rotary_dim or d
    out = torch.empty_like(x) if out is None else out
    pos = positions.contiguous()
    if x.numel():
        rotary_kernel[(b * s, h)](
            x,
            cos.contiguous(),
            sin.contiguous(),
            pos,
            out,
            s,
            x.stride(0),
            x.stride(1),
            x.stride(2),
            out.stride(0),
            out.stride(1),
            out.stride(2),
            0 if pos.shape[0] == 1 else pos.stride(0),
            d,
            rd // 2,
            cos.shape[1],
            INTERLEAVED=interleaved,
            BLOCK_HALF=pow2(rd // 2),
            BLOCK_D=pow2(d),
            num_warps=num_warps,
        )
    return out


def aot_specs(dtype: str) -> list[AotSpec]:
    ptrs = {"x_ptr": dtype, "cos_ptr": dtype, "sin_ptr": dtype, "pos_ptr": "i64", "out_ptr": dtype}
    return [
        AotSpec(
            "rotary_kernel",
            ptrs,
            {"INTERLEAVED": il, "BLOCK_HALF": 64, "BLOCK_D": 128},
            num_warps=1,
        )
        for il in (False, True)
    ]
