"""Decode attention (flash-decoding): implements `llm.scaled_dot_product_attention` for one query
token per sequence over a preallocated KV cache (`triton.decode_attention`).

Split-K: the cache rows [0, p] of query position p (read from device memory) are cut into
`num_splits` slices of `split_len` rows; one program per (batch, kv head, slice) computes the
partial softmax of all the kv head's query heads (GQA: q heads h*g .. h*g+g-1 share the loaded
K/V tile), writing the normalized partial output and its log-sum-exp; a second kernel merges
the slices. Causal by construction (keys j <= p), sliding window W keeps p - W < j, soft-cap c
maps scores to c * tanh(s / c) before masking. Caches are f32/f16/bf16, or int8 with f32 scales
[B, Hkv, capacity] (one per batch row, head and position). The grid depends only on the cache
capacity, so a CUDA graph replays the step at every position.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import AotSpec, cdiv, kv_ptr_types, pow2


@triton.jit
def decode_attn_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    pos_ptr,
    po_ptr,
    plse_ptr,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_sb,
    stride_sh,
    pos_stride_b,
    kv_heads,
    head_dim,
    split_len,
    num_splits,
    group,
    sm_scale,
    softcap,
    window,
    QUANT: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # long: one @triton.jit kernel: the tile loop and its online-softmax state (m, l, acc) in one program
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (bh // kv_heads).to(tl.int64)
    kvh = (bh % kv_heads).to(tl.int64)
    p = tl.load(pos_ptr + b * pos_stride_b).to(tl.int32)
    g = tl.arange(0, BLOCK_G)
    mg = g < group
    d = tl.arange(0, BLOCK_D)
    md = d < head_dim
    qh = kvh * group + g
    q = tl.load(
        q_ptr + b * stride_qb + qh[:, None] * stride_qh + d[None, :],
        mask=mg[:, None] & md[None, :],
        other=0.0,
    ).to(tl.float32)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, p + 1)
    start = lo
    if window > 0:
        first = p - window + 1
        if first > lo:
            start = lo + ((first - lo) // BLOCK_N) * BLOCK_N
    m_i = tl.full((BLOCK_G,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    kbase = k_ptr + b * stride_kb + kvh * stride_kh
    vbase = v_ptr + b * stride_vb + kvh * stride_vh
    for n0 in range(start, hi, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        valid = j < hi
        if window > 0:
            valid = valid & (j > p - window)
        mkv = valid[:, None] & md[None, :]
        k = tl.load(
            kbase + j[:, None].to(tl.int64) * stride_ks + d[None, :], mask=mkv, other=0.0
        ).to(tl.float32)
        v = tl.load(
            vbase + j[:, None].to(tl.int64) * stride_vs + d[None, :], mask=mkv, other=0.0
        ).to(tl.float32)
        if QUANT:
            ks = tl.load(ks_ptr + b * stride_sb + kvh * stride_sh + j, mask=valid, other=0.0)
            vs = tl.load(vs_ptr + b * stride_sb + kvh * stride_sh + j, mask=valid, other=0.0)
            k = k * ks[:, None]
            v = v * vs[:, None]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * sm_scale
        if softcap > 0:
            z = s / softcap
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        acc = acc * alpha[:, None] + tl.sum(pr[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    row = (b * kv_heads * group + qh) * num_splits + split
    tl.store(po_ptr + row[:, None] * head_dim + d[None, :], out, mask=mg[:, None] & md[None, :])
    tl.store(plse_ptr + row, lse, mask=mg)


@triton.jit
def decode_attn_reduce_kernel(
    po_ptr,
    plse_ptr,
    out_ptr,
    num_splits,
    head_dim,
    q_heads,
    stride_ob,
    stride_oh,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // q_heads
    h = bh % q_heads
    s = tl.arange(0, BLOCK_S)
    ms = s < num_splits
    d = tl.arange(0, BLOCK_D)
    md = d < head_dim
    lse = tl.load(plse_ptr + bh * num_splits + s, mask=ms, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.where(ms & (lse > float("-inf")), tl.exp(lse - top), 0.0)
    o = tl.load(
        po_ptr + (bh * num_splits + s)[:, None] * head_dim + d[None, :],
        mask=ms[:, None] & md[None, :],
        other=0.0,
    )
    res = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty), mask=md)


KERNELS = {
    "decode_attn_split_kernel": decode_attn_split_kernel,
    "decode_attn_reduce_kernel": decode_attn_reduce_kernel,
}


def params(capacity: int, head_dim: int, group: int, split_k: int = 0) -> dict[str, int]:
    """Launch parameters: split count and slice length over the cache capacity, tile sizes."""
    bg, bd = pow2(group), pow2(head_dim, 16)
    block_n = max(16, min(64, 16384 // (bg * bd)))
    splits = split_k or max(1, min(32, cdiv(capacity, 256)))
    split_len = cdiv(cdiv(capacity, splits), block_n) * block_n
    return {"split_k": cdiv(capacity, split_len), "split_len": split_len, "block_n": block_n}


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    scale: float = 0.0,
    softcap: float = 0.0,
    window: int = 0,
    split_k: int = 0,
    block_n: int = 0,
    out: torch.Tensor | None = None,
    num_warps: int = 4,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    # long: a launcher: most of it is the argument list of the two kernel launches
    """q [B, Hq, 1, D]; caches [B, Hkv, capacity, D]; positions [B|1, 1] (the query's position p;
    keys 0..p are in the cache) -> [B, Hq, 1, D]."""
    bsz, hq, one, d = q.shape
    if one != 1:
        raise ValueError("decode attention takes one query token per sequence")
    _, hkv, cap, _ = k_cache.shape
    group = hq // hkv
    prm = params(cap, d, group, split_k)
    bn = block_n or prm["block_n"]
    splits, split_len = prm["split_k"], prm["split_len"]
    if block_n:
        split_len = cdiv(split_len, bn) * bn
        splits = cdiv(cap, split_len)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    if workspace is None:
        po = torch.empty((bsz, hq, splits, d), dtype=torch.float32, device=q.device)
        plse = torch.empty((bsz, hq, splits), dtype=torch.float32, device=q.device)
    else:
        po, plse = workspace
    quant = k_cache.dtype == torch.int8
    ks: Any = k_scales if quant else k_cache
    vs = v_scales if quant else v_cache
    pos = positions.contiguous()
    sm = scale or d**-0.5
    decode_attn_split_kernel[(bsz * hkv, splits)](
        q,
        k_cache,
        v_cache,
        ks,
        vs,
        pos,
        po,
        plse,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        ks.stride(0) if quant else 0,
        ks.stride(1) if quant else 0,
        0 if pos.shape[0] == 1 else pos.stride(0),
        hkv,
        d,
        split_len,
        splits,
        group,
        float(sm),
        float(softcap),
        int(window),
        QUANT=quant,
        BLOCK_G=pow2(group),
        BLOCK_N=bn,
        BLOCK_D=pow2(d, 16),
        num_warps=num_warps,
    )
    decode_attn_reduce_kernel[(bsz * hq,)](
        po,
        plse,
        out,
        splits,
        d,
        hq,
        out.stride(0),
        out.stride(1),
        BLOCK_S=pow2(splits),
        BLOCK_D=pow2(d, 16),
        num_warps=1,
    )
    return out


def aot_specs(dtype: str) -> list[AotSpec]:
    out = []
    for quant in (False, True):
        ptrs = {
            "q_ptr": dtype,
            **kv_ptr_types(dtype, quant),
            "pos_ptr": "i64",
            "po_ptr": "fp32",
            "plse_ptr": "fp32",
        }
        out.append(
            AotSpec(
                "decode_attn_split_kernel",
                ptrs,
                {"QUANT": quant, "BLOCK_G": 4, "BLOCK_N": 32, "BLOCK_D": 128},
                floats=("sm_scale", "softcap"),
            )
        )
    out.append(
        AotSpec(
            "decode_attn_reduce_kernel",
            {"po_ptr": "fp32", "plse_ptr": "fp32", "out_ptr": dtype},
            {"BLOCK_S": 32, "BLOCK_D": 128},
            num_warps=1,
        )
    )
    return out
