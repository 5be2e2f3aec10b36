"""Embedding gather: implements `llm.embedding` (and `triton.embedding`).

out[t, :] = table[ids[t], :] for each flattened token t; ids outside [0, vocab) read zeros (the
runner checks ids on the host before the launch, as the reference raises).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import AotSpec, cdiv, pow2


@triton.jit
def embedding_kernel(ids_ptr, table_ptr, out_ptr, hidden, vocab, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    idx = tl.load(ids_ptr + t).to(tl.int64)
    ok = (idx >= 0) & (idx < vocab)
    m = cols < hidden
    row = tl.load(table_ptr + tl.where(ok, idx, 0) * hidden + cols, mask=m, other=0.0)
    row = tl.where(ok, row, 0.0)
    tl.store(out_ptr + t.to(tl.int64) * hidden + cols, row.to(out_ptr.dtype.element_ty), mask=m)


KERNELS = {"embedding_kernel": embedding_kernel}


def block_h(hidden: int) -> int:
    return min(1024, pow2(hidden, 16))


def embedding(
    table: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """table [vocab, hidden], ids any shape (integers) -> [*ids.shape, hidden]."""
    vocab, hidden = table.shape
    flat = ids.reshape(-1).contiguous()
    if out is None:
        out = torch.empty((*ids.shape, hidden), dtype=table.dtype, device=table.device)
    bh = block or block_h(hidden)
    if flat.numel():
        embedding_kernel[(flat.numel(), cdiv(hidden, bh))](
            flat, table.contiguous(), out, hidden, vocab, BLOCK_H=bh, num_warps=num_warps
        )
    return out


def aot_specs(dtype: str) -> list[AotSpec]:
    return [
        AotSpec(
            "embedding_kernel",
            {"ids_ptr": "i64", "table_ptr": dtype, "out_ptr": dtype},
            {"BLOCK_H": 1024},
        )
    ]
