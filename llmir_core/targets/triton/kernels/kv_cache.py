"""KV-cache append into a preallocated buffer: implements the cache write of a decoder
(`core.concat(past, new, axis=2)` on a cache entry, `triton.kv_append`), in the cache's dtype
(f32/f16/bf16) or in int8 with one f32 scale per batch row, head and position (the
`kv-cache-int8` rule: s = max|new| / 127 over head_dim, 1 for an all-zero row; codes =
round-half-even(new / s)).

Each new row [b, h, s, :] lands at the position read from device memory (positions[b, s]), so a
CUDA graph replays the step at each new position.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import AotSpec, pow2


@triton.jit
def kv_append_kernel(
    new_ptr,
    pos_ptr,
    cache_ptr,
    scale_ptr,
    seq,
    head_dim,
    stride_nb,
    stride_nh,
    stride_ns,
    stride_cb,
    stride_ch,
    stride_cs,
    stride_sb,
    stride_sh,
    pos_stride_b,
    QUANT: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bs = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = (bs // seq).to(tl.int64)
    s = (bs % seq).to(tl.int64)
    p = tl.load(pos_ptr + b * pos_stride_b + s).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    md = d < head_dim
    x = tl.load(new_ptr + b * stride_nb + h * stride_nh + s * stride_ns + d, mask=md, other=0.0).to(
        tl.float32
    )
    dst = cache_ptr + b * stride_cb + h * stride_ch + p * stride_cs + d
    if QUANT:
        amax = tl.max(tl.abs(x), axis=0)
        scale = tl.where(amax == 0.0, 1.0, amax / 127.0)
        y = x / scale
        r = tl.floor(y + 0.5)
        odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
        r = tl.where(((r - y) == 0.5) & odd, r - 1.0, r)
        tl.store(dst, r.to(tl.int8), mask=md)
        tl.store(scale_ptr + b * stride_sb + h * stride_sh + p, scale)
    else:
        tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=md)


KERNELS = {"kv_append_kernel": kv_append_kernel}


def kv_append(
    new: torch.Tensor,
    positions: torch.Tensor,
    cache: torch.Tensor,
    scales: torch.Tensor | None = None,
    *,
    num_warps: int = 1,
) -> None:
    """new [B, H, S, D] -> cache [B, H, capacity, D] at positions [B|1, S]; scales [B, H, capacity]
    (int8 cache)."""
    b, h, s, d = new.shape
    pos = positions.contiguous()
    quant = cache.dtype == torch.int8
    if quant and scales is None:
        raise ValueError("an int8 KV cache needs its scales buffer")
    sc: Any = scales if quant else cache
    if new.numel():
        kv_append_kernel[(b * s, h)](
            new,
            pos,
            cache,
            sc,
            s,
            d,
            new.stride(0),
            new.stride(1),
            new.stride(2),
            cache.stride(0),
            cache.stride(1),
            cache.stride(2),
            sc.stride(0) if quant else 0,
            sc.stride(1) if quant else 0,
            0 if pos.shape[0] == 1 else pos.stride(0),
            QUANT=quant,
            BLOCK_D=pow2(d),
            num_warps=num_warps,
        )


def aot_specs(dtype: str) -> list[AotSpec]:
    return [
        AotSpec(
            "kv_append_kernel",
            {"new_ptr": dtype, "pos_ptr": "i64", "cache_ptr": dtype, "scale_ptr": dtype},
            {"QUANT": False, "BLOCK_D": 128},
            num_warps=1,
        ),
        AotSpec(
            "kv_append_kernel",
            {"new_ptr": dtype, "pos_ptr": "i64", "cache_ptr": "i8", "scale_ptr": "fp32"},
            {"QUANT": True, "BLOCK_D": 128},
            num_warps=1,
        ),
    ]
