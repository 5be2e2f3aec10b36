"""Prefill attention (flash-attention style): implements `llm.scaled_dot_product_attention` for a
block of query tokens after `past` cached ones (`triton.prefill_attention`).

Query i sits at position p = kv_len - seq_q + i (aligned to the end of the keys, as the op
says); one program per (query tile, batch x q head) streams K/V tiles with an online softmax
(tl.dot on the tensor cores; f32 operands in IEEE precision). CAUSAL keeps j <= p, window W keeps
p - W < j (tiles wholly outside are skipped), soft-cap c applies c * tanh(s / c) first; GQA maps
q head h to kv head h // group. K/V are read from the cache buffers [B, Hkv, capacity, D]
(int8 with per-position f32 scales too).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import AotSpec, cdiv, ieee_dot, kv_ptr_types, pow2


@triton.jit
def prefill_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    out_ptr,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_sb,
    stride_sh,
    stride_ob,
    stride_oh,
    stride_os,
    q_heads,
    seq_q,
    kv_len,
    head_dim,
    group,
    sm_scale,
    softcap,
    window,
    CAUSAL: tl.constexpr,
    QUANT: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # long: one @triton.jit kernel: the tile loop and its online-softmax state (m, l, acc) in one program
    pm = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // q_heads).to(tl.int64)
    h = (bh % q_heads).to(tl.int64)
    kvh = h // group
    past = kv_len - seq_q
    i = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    mi = i < seq_q
    p = past + i
    d = tl.arange(0, BLOCK_D)
    md = d < head_dim
    q = tl.load(
        q_ptr + b * stride_qb + h * stride_qh + i[:, None].to(tl.int64) * stride_qs + d[None, :],
        mask=mi[:, None] & md[None, :],
        other=0.0,
    )
    if QUANT or IEEE:
        q = q.to(tl.float32)
    hi = kv_len
    if CAUSAL or window > 0:
        hi = tl.minimum(kv_len, past + (pm + 1) * BLOCK_M)
    lo = 0
    if window > 0:
        lo = tl.maximum(0, past + pm * BLOCK_M - window + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    kbase = k_ptr + b * stride_kb + kvh * stride_kh
    vbase = v_ptr + b * stride_vb + kvh * stride_vh
    for n0 in range(lo, hi, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        mj = j < kv_len
        kt = tl.load(
            kbase + j[None, :].to(tl.int64) * stride_ks + d[:, None],
            mask=md[:, None] & mj[None, :],
            other=0.0,
        )
        v = tl.load(
            vbase + j[:, None].to(tl.int64) * stride_vs + d[None, :],
            mask=mj[:, None] & md[None, :],
            other=0.0,
        )
        if QUANT:
            ks = tl.load(ks_ptr + b * stride_sb + kvh * stride_sh + j, mask=mj, other=0.0)
            vs = tl.load(vs_ptr + b * stride_sb + kvh * stride_sh + j, mask=mj, other=0.0)
            kt = kt.to(tl.float32) * ks[None, :]
            v = v.to(tl.float32) * vs[:, None]
        elif IEEE:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        if QUANT or IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * sm_scale
        if softcap > 0:
            z = s / softcap
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
        keep = mj[None, :] & (i[:, None] >= 0)
        if CAUSAL or window > 0:
            keep = keep & (j[None, :] <= p[:, None])
        if window > 0:
            keep = keep & (j[None, :] > p[:, None] - window)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        if QUANT or IEEE:
            acc = acc * alpha[:, None] + tl.dot(pr, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(mi, l_i, 1.0)[:, None]  # padding rows (i >= seq_q) see no key
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + i[:, None].to(tl.int64) * stride_os + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mi[:, None] & md[None, :],
    )


KERNELS = {"prefill_attn_kernel": prefill_attn_kernel}


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_len: int | None = None,
    *,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    causal: bool = True,
    scale: float = 0.0,
    softcap: float = 0.0,
    window: int = 0,
    block_m: int = 32,
    block_n: int = 32,
    out: torch.Tensor | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """q [B, Hq, Sq, D]; k, v [B, Hkv, >= kv_len, D] (the first kv_len rows are the keys) -> [B, Hq, Sq, D]."""
    bsz, hq, sq, d = q.shape
    hkv = k.shape[1]
    kv_len = k.shape[2] if kv_len is None else kv_len
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    quant = k.dtype == torch.int8
    ks: Any = k_scales if quant else k
    vs = v_scales if quant else v
    if q.numel():
        prefill_attn_kernel[(cdiv(sq, block_m), bsz * hq)](
            q,
            k,
            v,
            ks,
            vs,
            out,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            ks.stride(0) if quant else 0,
            ks.stride(1) if quant else 0,
            out.stride(0),
            out.stride(1),
            out.stride(2),
            hq,
            sq,
            kv_len,
            d,
            hq // hkv,
            float(scale or d**-0.5),
            float(softcap),
            int(window),
            CAUSAL=causal,
            QUANT=quant,
            IEEE=ieee_dot(q.dtype),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=pow2(d, 16),
            num_warps=num_warps,
        )
    return out


def aot_specs(dtype: str) -> list[AotSpec]:
    out = []
    for quant in (False, True):
        ptrs = {
            "q_ptr": dtype,
            **kv_ptr_types(dtype, quant),
            "out_ptr": dtype,
        }
        out.append(
            AotSpec(
                "prefill_attn_kernel",
                ptrs,
                {
                    "CAUSAL": True,
                    "QUANT": quant,
                    "IEEE": dtype == "fp32",
                    "BLOCK_M": 64,
                    "BLOCK_N": 64,
                    "BLOCK_D": 128,
                },
                floats=("sm_scale", "softcap"),
            )
        )
    return out
