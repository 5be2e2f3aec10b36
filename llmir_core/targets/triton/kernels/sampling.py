"""Token selection on the device: greedy argmax (`triton.argmax`, the sampler at temperature 0)
and temperature / top-k / top-p sampling (`triton.sample`), one program per row of logits.

argmax returns the first index of the maximum. Sampling keeps, of x = logits / temperature,
the top_k largest (ties at the k-th value kept, as llmir's Sampler) found by bisection over the
order-preserving int32 keys of the floats (exact, 32 passes), then the top-p nucleus: the
values whose strictly-larger mass is below top_p (an exact threshold, 32 more passes); it then
draws by inverse CDF in index order with the uniform number u[row] (supplied by the caller, so
the draw is reproducible and graph-capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmir_core.targets.triton.kernels.common import AotSpec, pow2


@triton.jit
def argmax_kernel(x_ptr, out_ptr, vocab, stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    best = tl.full((), float("-inf"), tl.float32)
    best_i = tl.full((), 0, tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(x_ptr + row * stride + idx, mask=idx < vocab, other=float("-inf")).to(
            tl.float32
        )
        bm = tl.max(x, axis=0)
        bi = tl.min(tl.where(x == bm, idx, 2147483647), axis=0)
        take = bm > best
        best_i = tl.where(take, bi, best_i)
        best = tl.where(take, bm, best)
    tl.store(out_ptr + row, best_i.to(tl.int64))


@triton.jit
def _key(x):
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def sample_kernel(
    x_ptr, u_ptr, out_ptr, vocab, stride, inv_temp, top_k, top_p, BLOCK_V: tl.constexpr
):
    # long: one @triton.jit kernel: the passes over a row (max, top-k, top-p, draw) share its registers
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride
    # the maximum (softmax shift)
    top = tl.full((), float("-inf"), tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
        top = tl.maximum(top, tl.max(x, axis=0))
    # top-k: the largest key T with count(key >= T) >= k (bisection over int32 keys)
    thr_k = tl.full((), -2147483647 - 1, tl.int64)
    if top_k > 0:
        if top_k < vocab:
            lo = tl.full((), -2147483647 - 1, tl.int64)
            hi = tl.full((), 2147483647, tl.int64)
            for _ in range(33):
                mid = lo + (hi - lo + 1) // 2
                cnt = tl.zeros((), tl.int32)
                for v0 in range(0, vocab, BLOCK_V):
                    idx = v0 + tl.arange(0, BLOCK_V)
                    x = (
                        tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
                        * inv_temp
                    )
                    k = _key(x).to(tl.int64)
                    cnt += tl.sum(((k >= mid) & (idx < vocab)).to(tl.int32), axis=0)
                ok = cnt >= top_k
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
            thr_k = lo
    # the kept mass after top-k
    total = tl.zeros((), tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
        keep = (_key(x).to(tl.int64) >= thr_k) & (idx < vocab)
        total += tl.sum(tl.where(keep, tl.exp(x - top), 0.0), axis=0)
    # top-p: the smallest key T with mass(key > T) < top_p * total
    thr = thr_k
    if top_p < 1.0:
        lo = thr_k
        hi = tl.full((), 2147483647, tl.int64)
        for _ in range(33):
            mid = lo + (hi - lo) // 2
            mass = tl.zeros((), tl.float32)
            for v0 in range(0, vocab, BLOCK_V):
                idx = v0 + tl.arange(0, BLOCK_V)
                x = (
                    tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
                    * inv_temp
                )
                k = _key(x).to(tl.int64)
                mass += tl.sum(
                    tl.where((k > mid) & (k >= thr_k) & (idx < vocab), tl.exp(x - top), 0.0), axis=0
                )
            ok = mass < top_p * total
            hi = tl.where(ok, mid, hi)
            lo = tl.where(ok, lo, mid + 1)
        thr = lo
    # the kept mass, then the inverse CDF at u in index order
    kept = tl.zeros((), tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
        keep = (_key(x).to(tl.int64) >= thr) & (idx < vocab)
        kept += tl.sum(tl.where(keep, tl.exp(x - top), 0.0), axis=0)
    target = tl.load(u_ptr + row).to(tl.float32) * kept
    run = tl.zeros((), tl.float32)
    pick = tl.full((), 2147483647, tl.int32)
    last = tl.full((), 0, tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
        keep = (_key(x).to(tl.int64) >= thr) & (idx < vocab)
        pk = tl.where(keep, tl.exp(x - top), 0.0)
        c = run + tl.cumsum(pk, axis=0)
        hit = (c > target) & keep
        pick = tl.minimum(pick, tl.min(tl.where(hit, idx, 2147483647), axis=0))
        last = tl.maximum(last, tl.max(tl.where(keep, idx, 0), axis=0))
        run += tl.sum(pk, axis=0)
    tl.store(out_ptr + row, tl.where(pick == 2147483647, last, pick).to(tl.int64))


KERNELS = {"argmax_kernel": argmax_kernel, "sample_kernel": sample_kernel}


def argmax(
    logits: torch.Tensor, out: torch.Tensor | None = None, *, block_v: int = 1024
) -> torch.Tensor:
    """logits [rows, vocab] -> int64 [rows]."""
    rows, vocab = logits.shape
    out = torch.empty((rows,), dtype=torch.int64, device=logits.device) if out is None else out
    argmax_kernel[(rows,)](
        logits, out, vocab, logits.stride(0), BLOCK_V=min(block_v, pow2(vocab, 16))
    )
    return out


def sample(
    logits: torch.Tensor,
    u: torch.Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    out: torch.Tensor | None = None,
    block_v: int = 1024,
) -> torch.Tensor:
    """logits [rows, vocab], u [rows] uniform in [0, 1) -> sampled int64 [rows] (temperature > 0)."""
    if temperature <= 0:
        raise ValueError("sampling needs temperature > 0 (use argmax for greedy)")
    rows, vocab = logits.shape
    out = torch.empty((rows,), dtype=torch.int64, device=logits.device) if out is None else out
    sample_kernel[(rows,)](
        logits,
        u,
        out,
        vocab,
        logits.stride(0),
        float(1.0 / temperature),
        int(top_k),
        float(top_p),
        BLOCK_V=min(block_v, pow2(vocab, 16)),
    )
    return out


def aot_specs(dtype: str) -> list[AotSpec]:
    return [
        AotSpec("argmax_kernel", {"x_ptr": dtype, "out_ptr": "i64"}, {"BLOCK_V": 1024}),
        AotSpec(
            "sample_kernel",
            {"x_ptr": dtype, "u_ptr": "fp32", "out_ptr": "i64"},
            {"BLOCK_V": 1024},
            floats=("inv_temp", "top_p"),
        ),
    ]
