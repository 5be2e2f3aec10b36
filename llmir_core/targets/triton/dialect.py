"""The `triton` dialect: ops that name llmir's Triton kernels and carry their launch parameters.

`llmir optimize --passes lower-triton` (the `triton` target's lowering) rewrites llm/core ops into
these, so the lowered text shows exactly which kernel runs each step and how it is launched
(block sizes, num_warps, split-K). Each op has the numpy reference semantics of the op it
lowers (the kernels are tested against the same references), so `llmir verify --against` and
the reference interpreter work on lowered modules. The kernels live in
llmir_core/targets/triton/kernels (imported only by that backend).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.dialects import llm, ranges
from llmir_core.dialects.opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError, encoding
from llmir_core.dialects.registry import register, register_dialect
from llmir_core.dialects.shapes import float_tensor, like, tensor_arg
from llmir_core.ir.dims import dim_add
from llmir_core.ir.types import DType, TensorType, Type

register_dialect(
    "triton", "launches of llmir's Triton kernels with their launch parameters (--target triton)"
)

# op -> the kernels (llmir_core/targets/triton/kernels) it launches
KERNELS: dict[str, tuple[str, ...]] = {
    "triton.embedding": ("embedding_kernel",),
    "triton.rms_norm": ("rms_norm_kernel",),
    "triton.add_rms_norm": ("rms_norm_kernel",),
    "triton.rotary": ("rotary_kernel",),
    "triton.matmul": ("gemv_kernel", "matmul_kernel"),
    "triton.gated_matmul": ("gemv_kernel", "matmul_kernel"),
    "triton.q_matmul": ("qgemv_kernel", "qmatmul_kernel"),
    "triton.kv_append": ("kv_append_kernel",),
    "triton.attention": (
        "decode_attn_split_kernel",
        "decode_attn_reduce_kernel",
        "prefill_attn_kernel",
    ),
    "triton.argmax": ("argmax_kernel",),
}

_WARPS = Attr("num_warps", "int", 4, doc="warps per program")
_MM_BLOCKS = (
    Attr("block_m", "int", 64, doc="matmul_kernel rows per tile (prefill)"),
    Attr("block_n", "int", 64, doc="matmul_kernel columns per tile"),
    Attr("block_k", "int", 32, doc="matmul_kernel reduction step"),
    Attr("gemv_block_n", "int", 32, doc="gemv_kernel output columns per program (decode)"),
    Attr("gemv_block_k", "int", 128, doc="gemv_kernel reduction step"),
    _WARPS,
)


def _pow2(ctx: InferCtx, *names: str) -> None:
    for n in names:
        v = ctx[n]
        if v < 1 or v & (v - 1):
            raise OpVerifyError(f"{n} must be a power of two, got {v}")


def _checked(infer: Any, *blocks: str) -> Any:
    def run(ctx: InferCtx) -> list[Type]:
        _pow2(ctx, *blocks)
        if ctx["num_warps"] not in (1, 2, 4, 8, 16, 32):
            raise OpVerifyError(f"num_warps must be 1, 2, 4, 8, 16 or 32, got {ctx['num_warps']}")
        out: list[Type] = infer(ctx)
        return out

    return run


def _ref_linear_t(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    return llm._ref_linear(args, {"activation": at["activation"], "transpose_b": True})


def _infer_matmul(ctx: InferCtx) -> list[Type]:
    return llm._infer_linear(_with(ctx, transpose_b=True))


def _with(ctx: InferCtx, **extra: Any) -> InferCtx:
    return InferCtx(ctx.op, ctx.types, {**ctx.attrs, **extra}, ctx.num_results, ctx.declared)


register(
    OpDef(
        name="triton.embedding",
        summary="embedding_kernel: llm.embedding (one program per token and block_h columns).",
        operands=(Operand("table", doc="[vocab, hidden]"), Operand("ids")),
        attrs=(Attr("block_h", "int", 1024, doc="hidden columns per program"), _WARPS),
        infer=_checked(llm._infer_embedding, "block_h"),
        reference=llm._ref_embedding,
        smt=encoding("llmir_core.targets.triton.smt", "triton_embedding"),
        interval=ranges.iv_first,
        verifies="as llm.embedding; block_h is a power of two.",
        example="%h = triton.embedding %table, %ids {block_h = 64} : (tensor<128x64xf32>, "
        "tensor<?batch x ?seq x i64>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)

register(
    OpDef(
        name="triton.rms_norm",
        summary="rms_norm_kernel: llm.rms_norm (one program per row of block columns).",
        operands=(Operand("x"), Operand("weight")),
        attrs=(
            Attr("eps", "float", 1e-6),
            Attr("offset", "float", 0.0, doc="added to weight (gemma)"),
            Attr("block", "int", 1024, doc="columns per program (>= hidden)"),
            _WARPS,
        ),
        infer=_checked(llm._infer_norm, "block"),
        reference=llm._ref_rms_norm,
        smt=encoding("llmir_core.targets.triton.smt", "triton_rms_norm"),
        interval=ranges.iv_norm,
        cost=ranges.cost_per_element(4),
        verifies="as llm.rms_norm; block is a power of two.",
        example="%y = triton.rms_norm %x, %w {block = 64, eps = 1e-05} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<64xf32>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)

register(
    OpDef(
        name="triton.add_rms_norm",
        summary="rms_norm_kernel with HAS_RES: llm.add_rms_norm (residual add "
        "fused; returns (normed, sum)).",
        operands=(Operand("x"), Operand("residual"), Operand("weight")),
        attrs=(
            Attr("eps", "float", 1e-6),
            Attr("offset", "float", 0.0, doc="added to weight (gemma)"),
            Attr("block", "int", 1024, doc="columns per program (>= hidden)"),
            _WARPS,
        ),
        infer=_checked(llm._infer_add_rms_norm, "block"),
        reference=llm._ref_add_rms_norm,
        results=("normed", "sum"),
        smt=encoding("llmir_core.targets.triton.smt", "triton_add_rms_norm"),
        interval=ranges.iv_add_norm,
        cost=ranges.cost_add_norm,
        verifies="as llm.add_rms_norm; block is a power of two.",
        example="%y, %s = triton.add_rms_norm %x, %r, %w {block = 64, eps = 1e-05} : "
        "(tensor<?batch x ?seq x 64 x f32>, tensor<?batch x ?seq x 64 x f32>, tensor<64xf32>) -> "
        "(tensor<?batch x ?seq x 64 x f32>, tensor<?batch x ?seq x 64 x f32>)",
    )
)

register(
    OpDef(
        name="triton.rotary",
        summary="rotary_kernel: llm.rotary_embedding (one program per token and "
        "head; positions read on the device).",
        operands=(Operand("x"), Operand("cos_cache"), Operand("sin_cache"), Operand("positions")),
        attrs=(
            Attr("interleaved", "bool", False),
            Attr("rotary_dim", "int", 0, doc="0 = all of head_dim"),
            Attr("num_warps", "int", 1, doc="warps per program"),
        ),
        infer=_checked(llm._infer_rotary),
        reference=llm._ref_rotary,
        smt=encoding("llmir_core.targets.triton.smt", "triton_rotary"),
        interval=ranges.iv_rotary,
        verifies="as llm.rotary_embedding.",
        example="%y = triton.rotary %q, %cos, %sin, %pos : (tensor<?batch x 4 x ?seq x 16 x f32>, "
        "tensor<256x8xf32>, tensor<256x8xf32>, tensor<?batch x ?seq x i64>) -> "
        "tensor<?batch x 4 x ?seq x 16 x f32>",
    )
)

register(
    OpDef(
        name="triton.matmul",
        summary="gemv_kernel (up to 4 rows) or matmul_kernel: act(x @ w^T + bias) "
        "with HF [out, in] weights (llm.linear with transpose_b, core.matmul by a weight).",
        operands=(Operand("x"), Operand("w", doc="[out, in]"), Operand("bias", optional=True)),
        attrs=(Attr("activation", "str", "none", choices=llm._LINEAR_ACTIVATIONS), *_MM_BLOCKS),
        infer=_checked(
            _infer_matmul, "block_m", "block_n", "block_k", "gemv_block_n", "gemv_block_k"
        ),
        reference=_ref_linear_t,
        smt=encoding("llmir_core.targets.triton.smt", "triton_matmul"),
        interval=llm._iv_linear,
        cost=llm._cost_linear,
        verifies="as llm.linear with transpose_b; block sizes are powers of two.",
        example="%y = triton.matmul %x, %w : (tensor<?batch x ?seq x 64 x f32>, tensor<96x64xf32>) -> "
        "tensor<?batch x ?seq x 96 x f32>",
    )
)


def _infer_gated(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    wg, wu = tensor_arg(ctx, 1, "w_gate"), tensor_arg(ctx, 2, "w_up")
    for t, n in ((wg, "w_gate"), (wu, "w_up")):
        if t.rank != 2 or t.dtype != x.dtype:
            raise OpVerifyError(f"{n} must be a 2-D [inter, hidden] matrix of x's dtype, got {t}")
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1")
    if not (
        llm._same(wg.shape[1], x.shape[-1])
        and llm._same(wu.shape[1], x.shape[-1])
        and llm._same(wg.shape[0], wu.shape[0])
    ):
        raise OpVerifyError(f"w_gate {wg} and w_up {wu} must both be [inter, {x.shape[-1]}]")
    return [like(x, (*x.shape[:-1], wg.shape[0]))]


def _ref_gated(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, wg, wu = (llm._f64(a) for a in args)
    return (llm._act64(at["activation"], x @ wg.T) * (x @ wu.T)).astype(args[0].dtype)


register(
    OpDef(
        name="triton.gated_matmul",
        summary="gemv_kernel / matmul_kernel with GATED: act(x @ w_gate^T) * "
        "(x @ w_up^T) in one pass over x (the first half of llm.gated_mlp).",
        operands=(
            Operand("x"),
            Operand("w_gate", doc="[inter, hidden]"),
            Operand("w_up", doc="[inter, hidden]"),
        ),
        attrs=(Attr("activation", "str", "silu", choices=llm._ACTIVATIONS), *_MM_BLOCKS),
        infer=_checked(
            _infer_gated, "block_m", "block_n", "block_k", "gemv_block_n", "gemv_block_k"
        ),
        reference=_ref_gated,
        smt=encoding("llmir_core.targets.triton.smt", "triton_gated_matmul"),
        cost=ranges.cost_gated_matmul,
        verifies="w_gate and w_up are [inter, hidden] of x's dtype; block sizes are powers of two.",
        example="%h = triton.gated_matmul %x, %wg, %wu : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<96x64xf32>, tensor<96x64xf32>) -> tensor<?batch x ?seq x 96 x f32>",
    )
)


def _infer_qmm(ctx: InferCtx) -> list[Type]:
    return llm._infer_qmatmul(_with(ctx, transpose_b=True))


register(
    OpDef(
        name="triton.q_matmul",
        summary="qgemv_kernel (up to 4 rows) or qmatmul_kernel: x @ "
        "dequantize(w)^T for GGUF q8_0/q4_0 and symmetric 4/8-bit nbits weights (repacked losslessly at "
        "build time).",
        operands=(
            Operand("x"),
            Operand("w_packed"),
            Operand("scales", optional=True, doc="nbits only"),
        ),
        attrs=(
            Attr("block_m", "int", 32),
            Attr("block_n", "int", 64),
            Attr("block_k", "int", 64),
            Attr("gemv_block_n", "int", 32),
            Attr("gemv_block_k", "int", 128),
            _WARPS,
        ),
        infer=_checked(_infer_qmm, "block_m", "block_n", "block_k", "gemv_block_n", "gemv_block_k"),
        reference=lambda a, at: llm._ref_qmatmul(a, {"transpose_b": True}),
        smt=encoding("llmir_core.targets.triton.smt", "triton_q_matmul"),
        cost=ranges.cost_matmul,
        verifies="as llm.quantized_matmul with transpose_b; block sizes are powers of two.",
        example="%y = triton.q_matmul %x, %w : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<128x64x!quant.q4_0>) -> tensor<?batch x ?seq x 128 x f32>",
    )
)


def _infer_kv_append(ctx: InferCtx) -> list[Type]:
    past, new = tensor_arg(ctx, 0, "past"), tensor_arg(ctx, 1, "new")
    if past.rank != 4 or new.rank != 4 or past.dtype != new.dtype:
        raise OpVerifyError(
            f"past and new must be [batch, kv_heads, len, head_dim] of one dtype, got {past}, {new}"
        )
    for i, what in ((0, "batch"), (1, "kv_heads"), (3, "head_dim")):
        if not llm._same(past.shape[i], new.shape[i]):
            raise OpVerifyError(f"past and new differ in {what}: {past.shape[i]} vs {new.shape[i]}")
    length = dim_add(past.shape[2], new.shape[2])
    return [TensorType((past.shape[0], past.shape[1], length, past.shape[3]), past.dtype)]


def _ref_kv_append(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    past, new = args
    if at["cache_dtype"] == "i8":
        x = np.asarray(new, np.float32)
        amax = np.abs(x).max(axis=-1, keepdims=True)
        s = np.where(amax == 0, np.float32(1), amax / np.float32(127)).astype(np.float32)
        new = (np.rint(x / s).astype(np.int8).astype(np.float32) * s).astype(past.dtype)
    return np.concatenate([past, new], axis=2)


register(
    OpDef(
        name="triton.kv_append",
        summary="kv_append_kernel: a KV-cache entry concat(past, new, axis=2) "
        "written in place into the preallocated cache buffer at the rows' positions; cache_dtype i8 "
        "stores int8 codes with one f32 scale per batch row, head and position (new rows read back as "
        "codes * scale, the kv-cache-int8 rule).",
        operands=(
            Operand("past", doc="[B, Hkv, past, D] (a cache argument)"),
            Operand("new", doc="[B, Hkv, S, D]"),
        ),
        attrs=(
            Attr(
                "cache_dtype",
                "str",
                "native",
                choices=("native", "i8"),
                doc="native: the activations' dtype; i8: int8 codes + scales",
            ),
            Attr("num_warps", "int", 1, doc="warps per program"),
        ),
        infer=_checked(_infer_kv_append),
        reference=_ref_kv_append,
        smt=encoding("llmir_core.targets.triton.smt", "triton_kv_append"),
        interval=ranges.iv_union,
        verifies="past and new are rank-4 of one dtype agreeing in batch, kv_heads and head_dim.",
        example="%k = triton.kv_append %past, %new : (tensor<?batch x 2 x ?past x 16 x f32>, "
        "tensor<?batch x 2 x ?seq x 16 x f32>) -> tensor<?batch x 2 x ?past+?seq x 16 x f32>",
    )
)

register(
    OpDef(
        name="triton.attention",
        summary="decode_attn_split_kernel + decode_attn_reduce_kernel "
        "(flash-decoding, one query token: split_k slices of the cache) or prefill_attn_kernel "
        "(flash attention over query tiles): llm.scaled_dot_product_attention without a mask operand.",
        operands=(Operand("q"), Operand("k"), Operand("v")),
        attrs=(
            Attr("causal", "bool", False),
            Attr("scale", "float", 0.0, doc="0 = 1/sqrt(D)"),
            Attr("softcap", "float", 0.0),
            Attr("sliding_window", "int", 0),
            Attr(
                "split_k",
                "int",
                0,
                doc="decode: cache slices (0: one per 256 rows of capacity, at most 32)",
            ),
            Attr("decode_block_n", "int", 32, doc="decode: cache rows per step"),
            Attr("block_m", "int", 32, doc="prefill: queries per program"),
            Attr("block_n", "int", 32, doc="prefill: keys per step"),
            _WARPS,
        ),
        infer=_checked(
            lambda c: llm._infer_sdpa(_with(c, softmax_eps=0.0, verify_invariant="")),
            "decode_block_n",
            "block_m",
            "block_n",
        ),
        reference=lambda a, at: llm._ref_sdpa(a, {**at, "softmax_eps": 0.0}),
        smt=encoding("llmir_core.targets.triton.smt", "triton_attention"),
        interval=ranges.iv_operand(2),
        cost=ranges.cost_attention,
        verifies="as llm.scaled_dot_product_attention (no mask, no softmax_eps); block sizes are powers of two.",
        example="%o = triton.attention %q, %k, %v {causal = true, split_k = 4} : "
        "(tensor<?batch x 4 x ?seq x 16 x f32>, tensor<?batch x 2 x ?past+?seq x 16 x f32>, "
        "tensor<?batch x 2 x ?past+?seq x 16 x f32>) -> tensor<?batch x 4 x ?seq x 16 x f32>",
    )
)


def _infer_argmax(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "logits")
    if x.rank < 1:
        raise OpVerifyError("logits must have rank >= 1")
    _pow2(ctx, "block_v")
    return [TensorType(x.shape[:-1], DType.i64)]


register(
    OpDef(
        name="triton.argmax",
        summary="argmax_kernel: the first index of the maximum over the last dim "
        "(greedy sampling on the device).",
        operands=(Operand("logits"),),
        attrs=(Attr("block_v", "int", 1024, doc="vocab entries per step"),),
        infer=_infer_argmax,
        reference=lambda a, at: np.argmax(a[0], axis=-1).astype(np.int64),
        smt=encoding("llmir_core.targets.triton.smt", "triton_argmax"),
        interval=ranges.iv_index,
        cost=ranges.cost_reduce(),
        verifies="logits is a float tensor of rank >= 1; block_v is a power of two.",
        example="%t = triton.argmax %logits : (tensor<?batch x 128 x f32>) -> tensor<?batch x i64>",
    )
)
