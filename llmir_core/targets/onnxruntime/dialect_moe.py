"""`ort.moe` and `ort.qmoe`: onnxruntime's com.microsoft MoE and QMoE nodes as ops of the IR.

Both route each token by `router_probs` (onnxruntime applies a softmax over the experts and keeps
the k best, ties to the lower index), optionally renormalise the kept probabilities
(`normalize`), and sum the chosen experts' SwiGLU MLPs silu(x @ w_gate[e]^T) * (x @ w_up[e]^T)
@ w_down[e]^T weighted by them. `ort.qmoe` may take `router_weights`: then the experts are still
chosen by `router_probs`, but weighted by `router_weights` at the chosen experts (sigmoid
scoring, group-limited routing). Measured on onnxruntime 1.32's CPU provider: only the
interleaved SwiGLU layout (swiglu_fusion = 1, alpha 1, beta 0) runs, gate and up weights
interleaved row by row in fc1 (the serializer does it); QMoE takes 4- or 8-bit blocks (one width
for all three weights) of a power-of-two size >= 16 along K with optional zero points; 4-bit
experts keep f32 activations at accuracy_level 0/1, 8-bit experts always quantize activations to
int8.

Weights stay logical, as for `ort.matmul_nbits`: the operands are the float expert weights the
module computes, and the serializer packs them. `quantize` says, per weight (gate, up, down),
whether the packing is lossless ("none": GGUF q4_0/q8_0/q5_0/q6_k/q3_k, nbits weights) or
rounds the weight to symmetric blocks / blocks with zero points; with every weight lossless the
op is exact and decomposes into the core ops of `llm.moe`'s decomposition.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.dialects.llm import _silu64
from llmir_core.dialects.llm_moe import dec_dense_weights, dec_experts
from llmir_core.dialects.opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError
from llmir_core.dialects.registry import register
from llmir_core.dialects.shapes import float_tensor, like, tensor_arg
from llmir_core.ir.types import Type

_QUANTIZE = ("none", "sym", "asym")


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise OpVerifyError(msg)


def _known_ne(a: Any, b: Any) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _infer(ctx: InferCtx, quantized: bool) -> list[Type]:
    x = float_tensor(ctx, 0, "input")
    _need(x.rank in (2, 3), f"input must be [tokens, hidden] or [batch, seq, hidden], got {x}")
    probs = tensor_arg(ctx, 1, "router_probs")
    _need(
        probs.rank == x.rank and probs.dtype == x.dtype,
        f"router_probs must be {x.dtype} [..., tokens, experts] like input, got {probs}",
    )
    experts, hidden = probs.shape[-1], x.shape[-1]
    wg, wu, wd = (tensor_arg(ctx, i, n) for i, n in ((2, "w_gate"), (3, "w_up"), (4, "w_down")))
    for t, nm in ((wg, "w_gate"), (wu, "w_up"), (wd, "w_down")):
        _need(
            t.rank == 3 and t.dtype == x.dtype,
            f"{nm} must be {x.dtype} [experts, out, in], got {t}",
        )
        _need(
            not _known_ne(t.shape[0], experts),
            f"{nm} has {t.shape[0]} experts, router_probs {experts}",
        )
    inter = wg.shape[1]
    _need(
        not _known_ne(wg.shape[2], hidden) and wu.shape[1:] == wg.shape[1:],
        f"w_gate and w_up must be [experts, inter, {hidden}], got {wg} and {wu}",
    )
    _need(
        not _known_ne(wd.shape[1], hidden) and not _known_ne(wd.shape[2], inter),
        f"w_down must be [experts, {hidden}, {inter}], got {wd}",
    )
    k = ctx["k"]
    _need(
        k >= 1 and not (isinstance(experts, int) and k > experts),
        f"k must be in 1..{experts}, got {k}",
    )
    n = len(ctx.types)
    if not quantized:
        _need(n == 5, f"takes 5 operands (input, router_probs, w_gate, w_up, w_down), got {n}")
        return [like(x)]
    _need(n in (5, 6), f"takes 5 operands, or 6 with router_weights; got {n}")
    if n == 6:
        rw = tensor_arg(ctx, 5, "router_weights")
        _need(
            rw.shape == probs.shape and rw.dtype == x.dtype,
            f"router_weights must have router_probs' type {probs}, got {rw}",
        )
    bits, block = ctx["bits"], ctx["block_size"]
    _need(bits in (4, 8), f"bits must be 4 or 8, got {bits}")
    _need(
        block >= 16 and block & (block - 1) == 0,
        f"block_size must be a power of two >= 16, got {block}",
    )
    for dim, what in ((hidden, "hidden"), (inter, "inter")):
        _need(
            not (isinstance(dim, int) and dim % block),
            f"{what} size {dim} is not a multiple of block_size {block}",
        )
    _need(
        0 <= ctx["accuracy_level"] <= 4, f"accuracy_level must be 0..4, got {ctx['accuracy_level']}"
    )
    q = ctx["quantize"]
    _need(
        len(q) == 3 and all(m in _QUANTIZE for m in q),
        f"quantize must list none/sym/asym for gate, up and down, got {list(q)}",
    )
    return [like(x)]


def _route(
    probs: np.ndarray, weights: np.ndarray | None, k: int, norm: bool
) -> tuple[np.ndarray, np.ndarray]:
    p = probs.astype(np.float64)
    e = np.exp(p - p.max(-1, keepdims=True))
    soft = e / e.sum(-1, keepdims=True)
    idx = np.argsort(-soft, axis=-1, kind="stable")[..., :k]
    w = np.take_along_axis(soft if weights is None else weights.astype(np.float64), idx, -1)
    if norm:
        w = w / w.sum(-1, keepdims=True)
    return idx, w


def _ref(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, probs = args[0], args[1]
    ws = [np.asarray(a, np.float64) for a in args[2:5]]
    if "quantize" in at:
        from llmir_core.targets.onnxruntime.dialect import fake_quant

        for i, mode in enumerate(at["quantize"]):
            if mode != "none":
                w = ws[i]
                flat = fake_quant(w.reshape(-1, w.shape[-1]), at["bits"], at["block_size"], mode)
                ws[i] = flat.reshape(w.shape).astype(np.float64)
    wg, wu, wd = ws
    idx, w = _route(probs, args[5] if len(args) > 5 else None, at["k"], at["normalize"])
    flat_x = x.astype(np.float64).reshape(-1, x.shape[-1])
    flat_i, flat_w = idx.reshape(-1, idx.shape[-1]), w.reshape(-1, w.shape[-1])
    out = np.zeros_like(flat_x)
    for t in range(flat_x.shape[0]):
        for e, weight in zip(flat_i[t], flat_w[t]):
            h = _silu64(wg[e] @ flat_x[t]) * (wu[e] @ flat_x[t])
            out[t] += weight * (wd[e] @ h)
    return out.reshape(x.shape).astype(x.dtype)


def _dec(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    if any(m != "none" for m in at.get("quantize", ())):
        raise OpVerifyError("a requantizing ort.qmoe has no exact decomposition")
    x, probs, wg, wu, wd = o[:5]
    soft = b.op("core.softmax", probs, axis=-1)
    dense = dec_dense_weights(b, soft, at["k"], at["normalize"], 1.0, o[5] if len(o) > 5 else None)
    return [dec_experts(b, x, dense, wg, wu, wd, "silu")]


_OPERANDS = (
    Operand("input", doc="[tokens, hidden] or [batch, seq, hidden]"),
    Operand("router_probs", doc="[..., experts]: chosen by the top k of their softmax"),
    Operand("w_gate", doc="[experts, inter, hidden]"),
    Operand("w_up", doc="[experts, inter, hidden]"),
    Operand("w_down", doc="[experts, hidden, inter]"),
)
_ROUTING = (
    Attr("k", "int", doc="experts per token"),
    Attr("normalize", "bool", True, doc="renormalise the kept weights to sum to 1"),
)

register(
    OpDef(
        name="ort.moe",
        summary="com.microsoft.MoE with interleaved SwiGLU experts: each token's k experts by the "
        "softmax of router_probs (ties: the lower index), their probabilities optionally "
        "renormalised (normalize), weighting silu(x @ w_gate[e]^T) * (x @ w_up[e]^T) @ w_down[e]^T.",
        operands=_OPERANDS,
        attrs=_ROUTING,
        infer=lambda ctx: _infer(ctx, False),
        reference=_ref,
        decompose=_dec,
        verifies="input is a float [tokens, hidden] or [batch, seq, hidden] tensor, router_probs "
        "[..., experts] of its type, the expert weights [experts, out, in] of its dtype chaining "
        "hidden -> inter -> hidden, and 1 <= k <= experts.",
        no_smt="routes each token to its top-k experts (a data-dependent choice of weights)",
        example="%y = ort.moe %x, %logits, %wg, %wu, %wd {k = 2} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<?batch x ?seq x 8 x f32>, tensor<8x128x64xf32>, tensor<8x128x64xf32>, "
        "tensor<8x64x128xf32>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)

register(
    OpDef(
        name="ort.qmoe",
        summary="com.microsoft.QMoE (quant_type int) with interleaved SwiGLU experts stored as "
        "bits-bit blocks of block_size along K: as ort.moe, but the chosen experts are weighted "
        "by router_weights when given. The weights are logical floats the serializer packs "
        '(quantize per gate/up/down: "none" lossless, "sym"/"asym" rounded to blocks).',
        operands=(
            *_OPERANDS,
            Operand("router_weights", optional=True, doc="[..., experts]: the mixing weights"),
        ),
        attrs=(
            *_ROUTING,
            Attr("bits", "int", doc="4 or 8, all three weights"),
            Attr("block_size", "int", doc="elements per block along K"),
            Attr(
                "accuracy_level", "int", 4, doc="0..4: 4 allows int8 activations (8 bits: always)"
            ),
            Attr(
                "quantize",
                "strs",
                ("none", "none", "none"),
                doc="gate, up, down: none (lossless repack), sym or asym (rounded to blocks)",
            ),
        ),
        infer=lambda ctx: _infer(ctx, True),
        reference=_ref,
        decompose=_dec,
        verifies="as ort.moe; router_weights has router_probs' type; bits is 4 or 8; block_size a "
        "power of two >= 16 dividing hidden and inter; accuracy_level 0..4; quantize has three "
        "none/sym/asym entries.",
        no_smt="routes each token to its top-k experts over packed quantized blocks",
        example="%y = ort.qmoe %x, %logits, %wg, %wu, %wd {k = 2, bits = 4, block_size = 32} : "
        "(tensor<?batch x ?seq x 64 x f32>, tensor<?batch x ?seq x 8 x f32>, tensor<8x128x64xf32>, "
        "tensor<8x128x64xf32>, tensor<8x64x128xf32>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)

__all__: list[str] = []
