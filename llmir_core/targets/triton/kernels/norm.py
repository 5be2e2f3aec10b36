"""RMS normalization, alone and fused with the residual add: implements `llm.rms_norm` and
`llm.add_rms_norm` (Gemma's `offset` included), i.e. `triton.rms_norm` / `triton.add_rms_norm`.

One program per row: sum = x + residual (rounded to the storage dtype, as the reference rounds
its `sum` result), y = sum * rsqrt(mean(sum^2) + eps) * (weight + offset), in f32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import AotSpec, pow2


@triton.jit
def rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    n_cols,
    eps,
    offset,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * n_cols + cols, mask=m, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + cols, s, mask=m)
        xf = s.to(tl.float32)
    else:
        xf = x.to(tl.float32)
    ms = tl.sum(xf * xf, axis=0) / n_cols
    inv = 1.0 / tl.sqrt(ms + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32) + offset
    tl.store(out_ptr + row * n_cols + cols, (xf * inv * w).to(out_ptr.dtype.element_ty), mask=m)


KERNELS = {"rms_norm_kernel": rms_norm_kernel}


def block_for(hidden: int) -> int:
    return pow2(hidden, 16)


def warps_for(hidden: int) -> int:
    return 4 if hidden <= 2048 else 8


def rms_norm(
    x: torch.Tensor,
    w: torch.Tensor,
    residual: torch.Tensor | None = None,
    *,
    eps: float,
    offset: float = 0.0,
    out: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normed, sum or None) over the last dim of x (contiguous)."""
    n = x.shape[-1]
    x = x.contiguous()
    rows = x.numel() // n if n else 0
    out = torch.empty_like(x) if out is None else out
    has_res = residual is not None
    if residual is not None:
        residual = residual.contiguous()
        sum_out = torch.empty_like(x) if sum_out is None else sum_out
    if rows:
        rms_norm_kernel[(rows,)](
            x,
            residual if has_res else x,
            w,
            out,
            sum_out if has_res else out,
            n,
            float(eps),
            float(offset),
            HAS_RES=has_res,
            BLOCK=block_for(n),
            num_warps=num_warps or warps_for(n),
        )
    return out, (sum_out if has_res else None)


def aot_specs(dtype: str) -> list[AotSpec]:
    ptrs = {"x_ptr": dtype, "res_ptr": dtype, "w_ptr": dtype, "out_ptr": dtype, "sum_ptr": dtype}
    return [
        AotSpec(
            "rms_norm_kernel",
            ptrs,
            {"HAS_RES": r, "BLOCK": 4096},
            floats=("eps", "offset"),
            num_warps=8,
        )
        for r in (False, True)
    ]
