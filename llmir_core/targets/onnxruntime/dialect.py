"""The `ort` dialect: the ops onnxruntime's decoder graph executes, as ops of the IR.

`llmir optimize --target onnxruntime` lowers `llm.*`/`core.*` ops into these
(llmir_core/passes/lower_ort_*.py); the serializer (llmir_core/targets/onnxruntime/serialize_decoder.py) maps each
to its ONNX node(s) with no pattern matching. Each op's reference is the numpy meaning of the
node; each exact op declares a decomposition into the `llm`/`core` ops it replaced, so
translation validation expands it and meets the unlowered module's terms.

Weights stay logical: `ort.matmul_nbits` takes the float weight the module computes (a
dequantized GGUF tensor, an f32 weight, a row-concatenation of weights); the last lowering pass
(pack-ort-weights) puts an `ort.pack` between it and the weight, which says how the artifact
stores it (MatMulNBits' blocks, f32 panels) and which the serializer writes 1:1. With `quantize = "none"` the packing must be lossless (GGUF
q4_0/q8_0/q5_0/q6_k/q3_k, nbits weights, GPTQ/AWQ/compressed-tensors checkpoint weights of 4 or 8
bits in power-of-two groups of consecutive columns): the op is exact and decomposes to a matmul. Otherwise
the reference rounds the weight to `bits`-bit blocks first (symmetric or with zero points) and
the op has no decomposition (validation is differential).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmir_core.dialects import ranges
from llmir_core.dialects.llm import _ref_rms_norm, _ref_rotary, _ref_sdpa
from llmir_core.dialects.opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError, encoding
from llmir_core.dialects.registry import register, register_dialect
from llmir_core.dialects.shapes import float_tensor, fmt_shape, like, tensor_arg
from llmir_core.ir.dims import dim_add
from llmir_core.ir.types import DType, QuantType, TensorType, Type
from llmir_core.quant import gguf_blocks

register_dialect(
    "ort", "onnxruntime target ops: GroupQueryAttention, MatMulNBits, fused norms and matmuls"
)

_F64 = np.float64


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise OpVerifyError(msg)


# -- group query attention -------------------------------------------------------------------------


def _gqa_parts(ctx_or_attrs: Any, n: int) -> dict[str, int]:
    """Operand indices by role: packed (qkv, past_k, past_v, positions[, cos, sin]) or
    unpacked (q, k, v, past_k, past_v, positions[, cos, sin])."""
    packed = bool(ctx_or_attrs["packed"])
    quantized = ctx_or_attrs["kv_quant"] != "none"
    biased = bool(ctx_or_attrs["qkv_bias"])
    base = 1 if packed else 3
    want = base + 3 + (2 if ctx_or_attrs["do_rotary"] else 0) + (2 if quantized else 0)
    want += 1 if biased else 0
    if n != want:
        form = "qkv" if packed else "q, k, v"
        rot = ", cos_cache, sin_cache" if ctx_or_attrs["do_rotary"] else ""
        rot += ", k_scale, v_scale" if quantized else ""
        rot += ", qkv_bias" if biased else ""
        raise OpVerifyError(
            f"expected {want} operands ({form}, past_key, past_value, positions{rot}), got {n}"
        )
    idx = {
        "q": 0,
        "k": 0 if packed else 1,
        "v": 0 if packed else 2,
        "past_k": base,
        "past_v": base + 1,
        "positions": base + 2,
    }
    if ctx_or_attrs["do_rotary"]:
        idx["cos"], idx["sin"] = base + 3, base + 4
    if quantized:
        idx["k_scale"], idx["v_scale"] = want - 2 - biased, want - 1 - biased
    if biased:
        idx["qkv_bias"] = want - 1
    return idx


def _infer_gqa(ctx: InferCtx) -> list[Type]:
    idx = _gqa_parts(ctx, len(ctx.types))
    h, hk = ctx["num_heads"], ctx["kv_num_heads"]
    _need(
        h > 0 and hk > 0 and h % hk == 0,
        f"num_heads ({h}) must be a positive multiple of kv_num_heads ({hk})",
    )
    pk, pv = (
        tensor_arg(ctx, idx["past_k"], "past_key"),
        tensor_arg(ctx, idx["past_v"], "past_value"),
    )
    _need(
        pk.rank == 4 and pv.rank == 4,
        f"past_key/past_value must be [batch, kv_heads, past, head_dim], got {pk}",
    )
    d = pk.shape[3]
    _need(isinstance(d, int), "past_key's head_dim must be static")
    _need(
        pk.shape[1] == hk and pv.shape[1] == hk,
        f"past_key has {pk.shape[1]} heads but kv_num_heads is {hk}",
    )
    q = float_tensor(ctx, 0, "query")
    cache_dt = _gqa_cache_dtype(ctx, idx, pk, pv, q, hk, d)
    _gqa_qkv(ctx, idx, q, h, hk, d)
    batch, seq = q.shape[0], q.shape[1]
    _gqa_positions(ctx, idx, d)
    for key in ("scale", "softcap"):
        _need(
            ctx[key] >= 0 and math.isfinite(ctx[key]),
            f"{key} must be finite and >= 0, got {ctx[key]}",
        )
    _need(ctx["local_window_size"] >= 0, "local_window_size must be >= 0")
    if ctx["kernel"] == "llmir":
        why = gqa_llmir_unsupported(ctx, d)
        _need(why is None, f'kernel "llmir" does not take {why}')
    total = dim_add(pk.shape[2], seq)
    present = TensorType((batch, hk, total, d), cache_dt)
    return [like(q, (batch, seq, h * d)), present, present]


def _gqa_cache_dtype(
    ctx: InferCtx, idx: dict[str, int], pk: Any, pv: Any, q: Any, hk: int, d: Any
) -> DType:
    """The KV cache's dtype (i8 under kv_quant, else the query's), checked with its scales."""
    quant = ctx["kv_quant"]
    cache_dt = DType.i8 if quant != "none" else q.dtype
    _need(
        pk.dtype == cache_dt and pv.dtype == cache_dt,
        f"past_key/past_value must be {cache_dt}"
        + (f" (kv_quant = {quant})" if quant != "none" else " (the query's dtype)"),
    )
    if quant != "none":
        want_s = (1,) if quant == "per_tensor" else (1, hk, 1, d)
        for role in ("k_scale", "v_scale"):
            st = tensor_arg(ctx, idx[role], role)
            _need(
                st.dtype == DType.f32 and st.shape == want_s,
                f"{role} must be f32 {fmt_shape(want_s)} for kv_quant = {quant}, got {st}",
            )
    return cache_dt


def _gqa_qkv(ctx: InferCtx, idx: dict[str, int], q: Any, h: int, hk: int, d: Any) -> None:
    """The projections: packed [batch, seq, (h + 2 hk) d] (with its optional bias) or q, k, v
    each [batch, seq, heads * d] or [batch, seq, heads, d]."""
    if ctx["qkv_bias"]:
        bias = tensor_arg(ctx, idx["qkv_bias"], "qkv_bias")
        want_b = ((h + 2 * hk) * d,)
        _need(
            ctx["packed"] and ctx["kernel"] == "llmir",
            'qkv_bias takes the packed form on kernel "llmir"',
        )
        _need(
            bias.dtype == q.dtype and bias.shape == want_b,
            f"qkv_bias must be {q.dtype} {fmt_shape(want_b)}, got {bias}",
        )
    widths = {"q": h * d, "k": hk * d, "v": hk * d}
    if ctx["packed"]:
        _need(
            q.rank == 3,
            f"packed qkv must be [batch, seq, (num_heads + 2 kv_num_heads) head_dim], got {q}",
        )
        want = (h + 2 * hk) * d
        _need(
            q.shape[2] == want,
            f"packed qkv width {q.shape[2]} is not (num_heads + 2 kv_num_heads) * head_dim = {want}",
        )
    else:
        for role in ("q", "k", "v"):
            t = tensor_arg(ctx, idx[role], role)
            _need(t.dtype == q.dtype, f"{role} has dtype {t.dtype}, expected {q.dtype}")
            heads = h if role == "q" else hk
            ok = (t.rank == 3 and t.shape[2] == widths[role]) or (
                t.rank == 4 and t.shape[2:] == (heads, d)
            )
            _need(
                ok,
                f"{role} must be [batch, seq, {widths[role]}] or [batch, seq, {heads}, {d}], "
                f"got {fmt_shape(t.shape)}",
            )


def _gqa_positions(ctx: InferCtx, idx: dict[str, int], d: Any) -> None:
    """positions i64 [batch, seq]; with do_rotary, cos/sin caches [max_pos, rotary_dim/2]."""
    pos = tensor_arg(ctx, idx["positions"], "positions")
    _need(
        pos.rank == 2 and pos.dtype == DType.i64, f"positions must be i64 [batch, seq], got {pos}"
    )
    if ctx["do_rotary"]:
        cos, sin = (
            tensor_arg(ctx, idx["cos"], "cos_cache"),
            tensor_arg(ctx, idx["sin"], "sin_cache"),
        )
        _need(
            cos.rank == 2 and sin.shape == cos.shape,
            f"cos/sin caches must be [max_pos, rotary_dim/2], got {cos}",
        )
        rd = int(ctx["rotary_dim"] or d)  # type: ignore[arg-type]  # d is static (checked above)
        _need(
            cos.shape[1] == rd // 2,
            f"cos_cache width {cos.shape[1]} is not rotary_dim/2 = {rd // 2}",
        )


GQA_KERNELS = ("onnxruntime", "llmir")  # ort.group_query_attention's `kernel`


def gqa_llmir_unsupported(attrs: Any, head_dim: object) -> str | None:
    """What of an ort.group_query_attention llmir's kernel (ai.llmir GroupQueryAttention) does
    not take, or None: head_dim a multiple of 8 up to 256 (f32 or int8 caches, rotary, softcap
    and sliding windows all run)."""
    del attrs  # every attribute llmir emits is taken
    if not isinstance(head_dim, int) or head_dim % 8 or not 0 < head_dim <= 256:
        return f"head_dim {head_dim} (a multiple of 8 up to 256)"
    return None


def _split_heads(x: np.ndarray, heads: int, d: int) -> np.ndarray:
    """[B, S, N*D] or [B, S, N, D] -> [B, N, S, D]."""
    if x.ndim == 3:
        x = x.reshape(x.shape[0], x.shape[1], heads, d)
    return np.swapaxes(x, 1, 2)


def _gqa_inputs(args: list[np.ndarray], at: dict[str, Any]) -> tuple[np.ndarray, ...]:
    idx = _gqa_parts(at, len(args))
    h, hk = at["num_heads"], at["kv_num_heads"]
    d = args[idx["past_k"]].shape[3]
    if at["packed"]:
        qkv = args[0]
        if at.get("qkv_bias"):
            qkv = qkv + args[idx["qkv_bias"]]
        q, k, v = qkv[..., : h * d], qkv[..., h * d : (h + hk) * d], qkv[..., (h + hk) * d :]
    else:
        q, k, v = args[idx["q"]], args[idx["k"]], args[idx["v"]]
    return q, k, v, args[idx["past_k"]], args[idx["past_v"]], args[idx["positions"]], idx  # type: ignore[return-value]


def kv_int8_codes(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """onnxruntime's int8 KV cache store (CPU GroupQueryAttention, measured): x * (1/s) in f32,
    rounded half to even, saturated to [-128, 127]."""
    inv = np.float32(1.0) / scale.astype(np.float32)
    r = np.rint(x.astype(np.float32) * inv)
    return np.clip(r, -128, 127).astype(np.int8)


def _ref_gqa(args: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    q, k, v, pk, pv, pos, idx = _gqa_inputs(args, at)
    h, hk = at["num_heads"], at["kv_num_heads"]
    d = pk.shape[3]
    q4, k4, v4 = _split_heads(q, h, d), _split_heads(k, hk, d), _split_heads(v, hk, d)
    if at["do_rotary"]:
        rot = {"interleaved": bool(at["rotary_interleaved"]), "rotary_dim": at["rotary_dim"]}
        cos, sin = args[idx["cos"]], args[idx["sin"]]
        q4, k4 = _ref_rotary([q4, cos, sin, pos], rot), _ref_rotary([k4, cos, sin, pos], rot)
    if at["kv_quant"] != "none":  # int8 codes of the new rows; attention reads f32(codes) * s
        ks, vs = args[idx["k_scale"]], args[idx["v_scale"]]
        k_all = np.concatenate([pk, kv_int8_codes(k4, ks)], axis=2)
        v_all = np.concatenate([pv, kv_int8_codes(v4, vs)], axis=2)
        k_att, v_att = k_all.astype(np.float32) * ks, v_all.astype(np.float32) * vs
    else:
        k_all = np.concatenate([pk, k4.astype(pk.dtype)], axis=2)
        v_all = np.concatenate([pv, v4.astype(pv.dtype)], axis=2)
        k_att, v_att = k_all, v_all
    o = _ref_sdpa(
        [q4, k_att, v_att],
        {
            "causal": True,
            "scale": at["scale"],
            "softcap": at["softcap"],
            "sliding_window": at["local_window_size"],
            "softmax_eps": 0.0,
        },
    )
    b, s = o.shape[0], o.shape[2]
    return [np.swapaxes(o, 1, 2).reshape(b, s, h * d), k_all, v_all]


def _dec_gqa(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    idx = _gqa_parts(at, len(o))
    h, hk = at["num_heads"], at["kv_num_heads"]
    d = o[idx["past_k"]].type.shape[3]
    if at["packed"]:
        qkv = b.op("core.add", o[0], o[idx["qkv_bias"]]) if at.get("qkv_bias") else o[0]
        q, k, v = b.create(
            "core.split", [qkv], {"axis": -1, "sizes": (h * d, hk * d, hk * d)}
        ).results
    else:
        q, k, v = o[idx["q"]], o[idx["k"]], o[idx["v"]]

    def heads(x: Any, n: int) -> Any:
        if x.type.rank == 3:
            x = b.op("core.reshape", x, shape=(0, 0, n, d))
        return b.op("core.transpose", x, perm=(0, 2, 1, 3))

    q4, k4, v4 = heads(q, h), heads(k, hk), heads(v, hk)
    if at["do_rotary"]:
        rot = {"interleaved": bool(at["rotary_interleaved"]), "rotary_dim": at["rotary_dim"]}
        cs = [o[idx["cos"]], o[idx["sin"]], o[idx["positions"]]]
        q4 = b.create("llm.rotary_embedding", [q4, *cs], rot).result
        k4 = b.create("llm.rotary_embedding", [k4, *cs], rot).result
    if at["kv_quant"] != "none":  # the terms kv-cache-int8{scales=calibrated} writes
        from llmir_core.rewrite.quant_rules import kv_codes_static, kv_dequant
        from llmir_core.rewrite.terms import Match, V, build

        presents, reads = [], []
        for new, past, sc in ((k4, "past_k", "k_scale"), (v4, "past_v", "v_scale")):
            m = Match(values={"new": new, "s": o[idx[sc]]})
            codes = build(kv_codes_static(V("new"), V("s")), m, b)
            m.values["q"] = b.op("core.concat", o[idx[past]], codes, axis=2)
            presents.append(m.values["q"])
            reads.append(build(kv_dequant(V("q"), V("s")), m, b))
        (k_all, v_all), (k_att, v_att) = presents, reads
    else:
        k_all = b.op("core.concat", o[idx["past_k"]], k4, axis=2)
        v_all = b.op("core.concat", o[idx["past_v"]], v4, axis=2)
        k_att, v_att = k_all, v_all
    attrs: dict[str, Any] = {"causal": True}
    for src, dst in (
        ("scale", "scale"),
        ("softcap", "softcap"),
        ("local_window_size", "sliding_window"),
    ):
        if at[src]:
            attrs[dst] = at[src]
    out = b.create("llm.scaled_dot_product_attention", [q4, k_att, v_att], attrs).result
    out = b.op("core.reshape", b.op("core.transpose", out, perm=(0, 2, 1, 3)), shape=(0, 0, h * d))
    return [out, k_all, v_all]


register(
    OpDef(
        name="ort.group_query_attention",
        summary="com.microsoft.GroupQueryAttention over a KV buffer shared between past and present: "
        "q/k/v ([B, S, N*D] or [B, S, N, D], or one packed [B, S, (H + 2 Hkv) * D] when packed), "
        "optional rotary (do_rotary: cos/sin caches at `positions`) on q and k, "
        "present = concat(past, k/v, axis 2), and causal attention of the queries (aligned to "
        "the end of the keys) with num_heads / kv_num_heads grouping, scale (0 = 1/sqrt(D)), "
        "softcap and local_window_size (0 = unlimited). Returns (output [B, S, H*D], "
        "present_key, present_value). With kv_quant the caches are int8 codes with static f32 "
        "scales and attention reads the dequantized codes. With qkv_bias (packed form, llmir's "
        "kernel) the last operand is the projection's bias, added to qkv as the op reads it. "
        "Bound to one buffer, present writes only the new rows; "
        "seqlens_k and total_sequence_length are computed from positions.",
        operands=(
            Operand(
                "inputs",
                variadic=True,
                doc="q, k, v (or qkv when packed), past_key, past_value, positions [B, S] i64, "
                "then cos_cache, sin_cache when do_rotary, then k_scale, v_scale when kv_quant, "
                "then the packed projection's bias [(H + 2 Hkv) * D] when qkv_bias",
            ),
        ),
        attrs=(
            Attr("num_heads", "int", doc="query heads H"),
            Attr("kv_num_heads", "int", doc="key/value heads Hkv (H is a multiple)"),
            Attr("scale", "float", 0.0, doc="score scale; 0 means 1/sqrt(head_dim)"),
            Attr("softcap", "float", 0.0, doc="tanh soft-capping of the scores; 0 = off"),
            Attr(
                "local_window_size",
                "int",
                0,
                doc="keys visible per query (sliding window); 0 = all",
            ),
            Attr(
                "do_rotary", "bool", False, doc="rotate q and k by the cos/sin caches at positions"
            ),
            Attr(
                "rotary_interleaved", "bool", False, doc="rotary pairs (2i, 2i+1) instead of halves"
            ),
            Attr("rotary_dim", "int", 0, doc="features rotated; 0 = all of head_dim"),
            Attr("packed", "bool", False, doc="the first operand is the packed q|k|v projection"),
            Attr(
                "qkv_bias",
                "bool",
                False,
                doc="the last operand is a bias added to the packed qkv (kernel llmir only): "
                "the projection's bias add folded into the op",
            ),
            Attr(
                "kv_quant",
                "str",
                "none",
                choices=("none", "per_channel", "per_tensor"),
                doc="int8 cache with static scales k_scale/v_scale (last operands): "
                "per_channel [1, Hkv, 1, D] or per_tensor [1]; new rows are stored as "
                "i8(clamp(round_half_even(x * (1/s)), -128, 127)) and read as f32(codes) * s",
            ),
            Attr(
                "kernel",
                "str",
                "onnxruntime",
                choices=GQA_KERNELS,
                doc="onnxruntime (com.microsoft.GroupQueryAttention) or llmir (ai.llmir "
                "GroupQueryAttention from llmir's custom-op library, the same node interface; "
                "head_dim a multiple of 8 up to 256)",
            ),
        ),
        infer=_infer_gqa,
        reference=_ref_gqa,
        decompose=_dec_gqa,
        results=("output", "present_key", "present_value"),
        no_smt="it writes its KV buffer in place at per-row positions (seqlens); translation "
        "validation expands it through its decomposition",
        verifies="operands match the packed/do_rotary form, num_heads is a multiple of kv_num_heads, "
        "q/k/v widths are heads * head_dim (head_dim from past_key), the caches share q's dtype "
        "(int8 with f32 scales of the kv_quant layout when kv_quant is set), a qkv_bias is "
        "[(H + 2 Hkv) * D] of q's dtype on the packed form and kernel llmir, "
        "positions are i64 [batch, seq], scale/softcap/local_window_size are >= 0, and kernel "
        '"llmir" only where its kernel takes the op (head_dim a multiple of 8 up to 256).',
        example="%o, %pk, %pv = ort.group_query_attention %qkv, %past_k, %past_v, %pos, %cos, %sin "
        "{num_heads = 4, kv_num_heads = 2, do_rotary = true, packed = true} : "
        "(tensor<?batch x ?seq x 128 x f32>, tensor<?batch x 2 x ?past x 16 x f32>, "
        "tensor<?batch x 2 x ?past x 16 x f32>, tensor<?batch x ?seq x i64>, tensor<64x8xf32>, "
        "tensor<64x8xf32>) -> (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<?batch x 2 x ?past+?seq x 16 x f32>, tensor<?batch x 2 x ?past+?seq x 16 x f32>)",
    )
)


# -- matmuls -----------------------------------------------------------------------------------------


def _infer_fused_matmul(ctx: InferCtx) -> list[Type]:
    a, w = float_tensor(ctx, 0, "a"), tensor_arg(ctx, 1, "b")
    _need(a.rank >= 2, f"a must have rank >= 2, got {a}")
    _need(w.rank == 2 and w.dtype == a.dtype, f"b must be a 2-D {a.dtype} matrix, got {w}")
    n, k = (w.shape[0], w.shape[1]) if ctx["transB"] else (w.shape[1], w.shape[0])
    _need(
        k == a.shape[-1] or not (isinstance(k, int) and isinstance(a.shape[-1], int)),
        f"contraction dims differ: a has {a.shape[-1]}, b {k}",
    )
    return [like(a, (*a.shape[:-1], n))]


def _ref_fused_matmul(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    a, w = args
    return (a.astype(_F64) @ (w.T if at["transB"] else w).astype(_F64)).astype(a.dtype)


register(
    OpDef(
        name="ort.fused_matmul",
        summary="com.microsoft.FusedMatMul: a @ b^T (transB) or a @ b for a float weight b.",
        operands=(Operand("a", doc="[..., K]"), Operand("b", doc="[N, K] (transB) or [K, N]")),
        attrs=(Attr("transB", "bool", True, doc="b is [N, K]"),),
        infer=_infer_fused_matmul,
        reference=_ref_fused_matmul,
        decompose=lambda b, o, at: [
            b.op("core.matmul", o[0], o[1], transpose_b=True)
            if at["transB"]
            else b.op("core.matmul", o[0], o[1])
        ],
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_fused_matmul"),
        interval=ranges.iv_matmul,
        cost=ranges.cost_matmul,
        verifies="a is a float tensor of rank >= 2 and b a 2-D matrix of its dtype whose contraction dim matches.",
        example="%y = ort.fused_matmul %x, %w : (tensor<?batch x ?seq x 64 x f32>, tensor<128x64xf32>) "
        "-> tensor<?batch x ?seq x 128 x f32>",
    )
)


EPILOGUES = ("none", "swiglu")  # llmir's quantized matmuls: what follows the product


def _epilogue_attr() -> Attr:
    return Attr(
        "epilogue",
        "str",
        "none",
        choices=EPILOGUES,
        doc="none, or swiglu: b is [W_gate; W_up] (N = 2H rows) and the result is "
        "silu(a @ W_gate^T) * (a @ W_up^T), [..., H] (llmir's kernel only)",
    )


def _scale_dtype_attr() -> Attr:
    return Attr(
        "scale_dtype",
        "str",
        "f32",
        choices=("f32", "f16"),
        doc="f32, or f16: a quantizing op (quantize sym/asym) rounds each block's scale to f16 "
        "(stored so: 2 bytes a block instead of 4) and its codes use the rounded scale",
    )


def _epilogue_out(a: TensorType, n: Any, epilogue: str) -> Type:
    """The result type of an llmir quantized matmul [..., n] after its epilogue."""
    if epilogue == "swiglu" and isinstance(n, int):
        _need(n % 2 == 0, f'epilogue "swiglu" needs an even N ([W_gate; W_up]), got {n}')
        n = n // 2
    elif epilogue == "swiglu":
        _need(False, 'epilogue "swiglu" needs a static N')
    return like(a, (*a.shape[:-1], n))


def _cost_qmm(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """cost_matmul over the whole product: with the SwiGLU epilogue the result is half of N."""
    flops, nbytes = ranges.cost_matmul(op, env)
    return (2 * flops if op.attrs.get("epilogue", "none") == "swiglu" else flops), nbytes


def _swiglu64(y: np.ndarray) -> np.ndarray:
    h = y.shape[-1] // 2
    g = np.asarray(y[..., :h], _F64)
    return g / (1.0 + np.exp(-g)) * np.asarray(y[..., h:], _F64)


def _dec_epilogue(b: Any, y: Any, epilogue: str) -> Any:
    """silu(y[..., :H]) * y[..., H:] as core ops (the epilogue's meaning)."""
    if epilogue != "swiglu":
        return y
    n = y.type.shape[-1]
    g = b.op("core.slice", y, starts=(0,), ends=(n // 2,), axes=(-1,))
    u = b.op("core.slice", y, starts=(n // 2,), ends=(n,), axes=(-1,))
    return b.op("core.mul", b.op("core.silu", g), u)


def _infer_weight_matmul(ctx: InferCtx, dtypes: tuple[DType, ...], what: str) -> list[Type]:
    """a [..., K] f32 times a 2-D [N, K] weight b of one of `dtypes` (b transposed)."""
    a, w = float_tensor(ctx, 0, "a"), tensor_arg(ctx, 1, "b")
    _need(a.rank >= 2 and a.dtype == DType.f32, f"a must be an f32 tensor of rank >= 2, got {a}")
    _need(w.rank == 2 and w.dtype in dtypes, f"b must be a 2-D [N, K] {what} weight, got {w}")
    n, k = w.shape
    _need(
        k == a.shape[-1] or not (isinstance(k, int) and isinstance(a.shape[-1], int)),
        f"contraction dims differ: a has {a.shape[-1]}, b {k}",
    )
    return [_epilogue_out(a, n, ctx["epilogue"])]


def _infer_matmul16(ctx: InferCtx) -> list[Type]:
    return _infer_weight_matmul(ctx, (DType.f16, DType.bf16), "f16 or bf16")


def _ref_matmul16(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    a, w = args
    y = a.astype(_F64) @ w.astype(_F64).T
    if at.get("epilogue", "none") == "swiglu":
        y = _swiglu64(y)
    return y.astype(np.float32)


def _iv_weight_matmul(op: Any, ins: list[Any], env: dict[str, int], max_dim: int) -> Any:
    """iv_matmul, then (epilogue "swiglu") silu(gate) * up over the product's range."""
    y = ranges.iv_matmul(op, ins, env, max_dim)
    if op.attrs.get("epilogue", "none") != "swiglu":
        return y
    return ranges.mul((-0.28, max(y[1], 0.0)), y)


register(
    OpDef(
        name="ort.matmul16",
        summary="llmir's onnxruntime custom op (ai.llmir MatMulF16 / MatMulBf16, "
        "llmir_core/targets/onnxruntime/native): a @ b^T for an f32 a and a 16-bit weight b [N, K] read "
        'as stored and widened to f32 in registers (f32 accumulation). epilogue "swiglu": b '
        "is [W_gate; W_up] and the result is silu(a @ W_gate^T) * (a @ W_up^T), half of N wide "
        "(a gated MLP's first half in one op).",
        operands=(Operand("a", doc="[..., K] f32"), Operand("b", doc="[N, K] f16 or bf16")),
        attrs=(_epilogue_attr(),),
        infer=_infer_matmul16,
        reference=_ref_matmul16,
        decompose=lambda b, o, at: [
            _dec_epilogue(
                b,
                b.op("core.matmul", o[0], b.op("core.cast", o[1], to=DType.f32), transpose_b=True),
                at.get("epilogue", "none"),
            )
        ],
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_matmul16"),
        interval=_iv_weight_matmul,
        cost=_cost_qmm,
        verifies="a is an f32 tensor of rank >= 2 and b a 2-D f16/bf16 [N, K] weight whose K "
        'matches a\'s last dim; epilogue "swiglu" needs a static, even N.',
        example="%y = ort.matmul16 %x, %w : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<128x64xf16>) -> tensor<?batch x ?seq x 128 x f32>",
    )
)


PANEL_ROWS = (
    16  # rows per panel of ort.matmul_f32's "panel16" layout (targets/onnxruntime/panels.py)
)


def _infer_matmul_f32(ctx: InferCtx) -> list[Type]:
    out = _infer_weight_matmul(ctx, (DType.f32,), "f32")
    n = tensor_arg(ctx, 1, "b").shape[0]
    if ctx["epilogue"] == "swiglu" and ctx["layout"] == "panel16" and isinstance(n, int):
        # gate panel p and up panel p + H/16 hold the same output columns
        _need(
            n % (2 * PANEL_ROWS) == 0,
            f'epilogue "swiglu" in panels needs N = 2H with H a multiple of {PANEL_ROWS}, '
            f"got N = {n}",
        )
    return out


register(
    OpDef(
        name="ort.matmul_f32",
        summary="llmir's onnxruntime custom op (ai.llmir MatMulF32, llmir_core/targets/onnxruntime/native): "
        "a @ b^T for an f32 a and an f32 weight b [N, K] read in place (no prepacked copy: "
        "the session loads without repacking it). b is the logical weight; `layout` is how the "
        'serializer stores it: "rows" ([N, K] as is) or "panel16" ([ceil(N/16), K, 16]: panels '
        "of 16 rows transposed, zero-padded, the GEMM's packed layout, read with no packing per "
        'call; llmir_core/targets/onnxruntime/panels.py). epilogue "swiglu": b is [W_gate; W_up] and the '
        "result is silu(a @ W_gate^T) * (a @ W_up^T), half of N wide; in panels H = N/2 is a "
        "multiple of 16, so gate panel p and up panel p + H/16 hold the same output columns.",
        operands=(Operand("a", doc="[..., K] f32"), Operand("b", doc="[N, K] f32")),
        attrs=(
            Attr(
                "layout",
                "str",
                "rows",
                choices=("rows", "panel16"),
                doc="rows ([N, K]) or panel16 ([ceil(N/16), K, 16]): how b is stored",
            ),
            _epilogue_attr(),
        ),
        infer=_infer_matmul_f32,
        reference=_ref_matmul16,
        decompose=lambda b, o, at: [
            _dec_epilogue(
                b,
                b.op("core.matmul", o[0], o[1], transpose_b=True),
                at.get("epilogue", "none"),
            )
        ],
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_matmul_f32"),
        interval=_iv_weight_matmul,
        cost=_cost_qmm,
        verifies="a is an f32 tensor of rank >= 2 and b a 2-D f32 [N, K] weight whose K matches "
        'a\'s last dim; epilogue "swiglu" needs a static, even N (in panels: N a multiple of 32).',
        example='%y = ort.matmul_f32 %x, %w {layout = "panel16"} : (tensor<?batch x ?seq x 64 x f32>, '
        "tensor<128x64xf32>) -> tensor<?batch x ?seq x 128 x f32>",
    )
)

_QUANTIZE = ("none", "sym", "asym")
NBITS_KERNELS = ("mlas", "llmir")  # ort.matmul_nbits' `kernel`: which implementation runs it


def _infer_nbits(ctx: InferCtx) -> list[Type]:
    a = float_tensor(ctx, 0, "a")
    w = tensor_arg(ctx, 1, "b")
    _need(a.rank >= 2, f"a must have rank >= 2, got {a}")
    _need(w.rank == 2, f"b must be a 2-D [N, K] weight, got {w}")
    bits, block = ctx["bits"], ctx["block_size"]
    _need(bits in (4, 8), f"bits must be 4 or 8, got {bits}")
    _need(
        block >= 16 and block & (block - 1) == 0,
        f"block_size must be a power of two >= 16, got {block}",
    )
    _need(
        0 <= ctx["accuracy_level"] <= 4, f"accuracy_level must be 0..4, got {ctx['accuracy_level']}"
    )
    n, k = w.shape
    _need(
        k == a.shape[-1] or not (isinstance(k, int) and isinstance(a.shape[-1], int)),
        f"contraction dims differ: a has {a.shape[-1]}, b {k}",
    )
    if isinstance(k, int):
        _need(k % block == 0, f"K = {k} is not a multiple of block_size {block}")
    if ctx["kernel"] == "llmir":
        _need(
            block == 32 and a.dtype == DType.f32,
            f'kernel "llmir" takes f32 a and block_size 32, got {a.dtype} and {block}',
        )
    _need(
        ctx["epilogue"] == "none" or ctx["kernel"] == "llmir",
        f'epilogue "{ctx["epilogue"]}" needs kernel "llmir"',
    )
    _need(
        ctx["scale_dtype"] == "f32" or ctx["quantize"] != "none",
        'scale_dtype "f16" applies to a quantizing op (quantize sym/asym)',
    )
    if isinstance(w.dtype, QuantType):
        _need(
            w.dtype.scheme == "nbits" and w.dtype.bits == bits and w.dtype.block == block,
            f"packed b {w.dtype} does not match bits={bits}, block_size={block}",
        )
        _need(ctx["quantize"] == "none", 'a packed nbits b is used as is: quantize must be "none"')
        _need(len(ctx.types) in (3, 4), "a packed nbits b needs its scales (and zero points)")
    else:
        _need(w.dtype == a.dtype, f"b has dtype {w.dtype}, expected a's {a.dtype}")
        _need(len(ctx.types) == 2, "a float b takes no scales or zero points")
    return [_epilogue_out(a, n, ctx["epilogue"])]


def fake_quant(
    w: np.ndarray, bits: int, block: int, mode: str, scale_dtype: str = "f32"
) -> np.ndarray:
    """w rounded to `bits`-bit blocks along its rows (what MatMulNBits stores), as f32; with
    scale_dtype "f16" each block's scale is rounded to f16 first (the codes use that scale)."""
    from llmir_core.quant import nbits

    w32 = np.asarray(w, np.float32)
    sd = np.dtype(np.float16 if scale_dtype == "f16" else np.float32)
    codes, sc, zp = nbits.quantize(w32, bits, block, mode == "sym", sd)
    return nbits.dequantize(codes, sc, zp, bits, block, w32.shape)


def _ref_nbits(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    a, w = args[0], args[1]
    if len(args) > 2:
        from llmir_core.quant import dequantize

        w = dequantize(w, *args[2:])  # type: ignore[arg-type]  # a PackedArray at run time
    elif at["quantize"] != "none":
        w = fake_quant(
            w, at["bits"], at["block_size"], at["quantize"], at.get("scale_dtype", "f32")
        )
    y = a.astype(_F64) @ np.asarray(w, _F64).T
    if at.get("epilogue", "none") == "swiglu":
        y = _swiglu64(y)
    return y.astype(a.dtype)


def nbits_qtype(bits: int, block: int, mode: str, scale_dtype: str = "f32") -> QuantType:
    """The nbits format a requantizing op (`quantize` sym/asym) rounds its weight to."""
    return QuantType(
        "nbits",
        bits,
        block,
        DType.f16 if scale_dtype == "f16" else DType.f32,
        "none" if mode == "sym" else "int",
    )


def requantized(b: Any, w: Any, at: dict[str, Any]) -> list[Any]:
    """`llm.quantize` of the float weight w to the op's blocks: [codes, scales(, zero points)]
    (what the serializer stores for a requantizing op)."""
    q = nbits_qtype(at["bits"], at["block_size"], at["quantize"], at.get("scale_dtype", "f32"))
    return list(b.create("llm.quantize", [w], {"format": q}).results)


def _dec_nbits(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    """The op's meaning: a float b is a matmul (lossless packing); a packed b, or a float b
    rounded to blocks (`quantize` sym/asym: `llm.quantize` first), is `llm.quantized_matmul`
    over the codes, scales and zero points; then the epilogue."""
    if len(o) > 2:
        y = b.op("llm.quantized_matmul", *o)
    elif at["quantize"] != "none":
        y = b.op("llm.quantized_matmul", o[0], *requantized(b, o[1], at))
    else:
        y = b.op("core.matmul", o[0], o[1], transpose_b=True)
    return [_dec_epilogue(b, y, at.get("epilogue", "none"))]


register(
    OpDef(
        name="ort.matmul_nbits",
        summary="com.microsoft.MatMulNBits: a @ b^T with b stored as bits-bit blocks of block_size "
        "along K. b is the logical [N, K] float weight (the serializer packs it; quantize "
        '"none" means the packing is lossless, "sym"/"asym" that the weight is rounded '
        "to symmetric blocks / blocks with zero points) or an nbits-packed weight with its "
        "scales (and zero points). accuracy_level is the runtime's activation precision "
        '(4 = int8, 1 = f32). kernel selects the implementation, not the meaning: "mlas" '
        "(onnxruntime's MatMulNBits) or \"llmir\" (ai.llmir MatMulNBitsQ4/Q8 from llmir's "
        "custom-op library, block_size 32: the same stored blocks read in place; the rows of "
        "a are quantized to int8 per 32-block (accuracy_level 4's numerics), except that "
        'with more than 4 rows 8-bit blocks take f32 rows). epilogue "swiglu" (llmir\'s '
        "kernel only): b is the row-concatenation [W_gate; W_up] and the result is "
        "silu(a @ W_gate^T) * (a @ W_up^T), half of N wide (a gated MLP's first half in one op).",
        operands=(
            Operand("a", doc="[..., K] f32"),
            Operand("b", doc="[N, K] float or nbits-packed"),
            Operand("scales", optional=True, doc="nbits b only"),
            Operand("zero_points", optional=True, doc="nbits b with zero points only"),
        ),
        attrs=(
            Attr("bits", "int", doc="4 or 8"),
            Attr("block_size", "int", doc="elements per block along K"),
            Attr("accuracy_level", "int", 4, doc="0..4: activation precision at run time"),
            Attr(
                "quantize",
                "str",
                "none",
                choices=_QUANTIZE,
                doc="none (lossless repack), sym or asym (rounded to blocks)",
            ),
            Attr(
                "kernel",
                "str",
                "mlas",
                choices=NBITS_KERNELS,
                doc="mlas (onnxruntime MatMulNBits) or llmir (llmir's custom op, block_size 32)",
            ),
            _epilogue_attr(),
            _scale_dtype_attr(),
        ),
        infer=_infer_nbits,
        reference=_ref_nbits,
        decompose=_dec_nbits,
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_matmul_nbits"),
        cost=_cost_qmm,
        verifies="a is a float tensor, b a 2-D [N, K] weight with K a multiple of block_size (a float "
        "of a's dtype, or nbits-packed with matching bits/block and its scales), bits is 4 or 8, "
        'accuracy_level is 0..4, and kernel "llmir" has an f32 a and block_size 32.',
        example="%y = ort.matmul_nbits %x, %w {bits = 4, block_size = 32} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<128x64xf32>) -> tensor<?batch x ?seq x 128 x f32>",
    )
)


# -- GGUF blocks read in place ----------------------------------------------------------------------

# ort.matmul_gguf's `format`: the GGUF block formats llmir's kernel (ai.llmir MatMulGGUF) reads
GGUF_FORMATS = tuple(gguf_blocks.BLOCKS)


def gguf_block_elems(fmt: str) -> int:
    """Elements one stored block of GGUF format `fmt` covers along a row (256 for k-quants)."""
    from llmir_core.ir.types import GGUF_QUANTS

    q = GGUF_QUANTS[fmt]
    return q.super_block or q.block


def _infer_gguf(ctx: InferCtx) -> list[Type]:
    a, w = float_tensor(ctx, 0, "a"), tensor_arg(ctx, 1, "b")
    _need(a.rank >= 2 and a.dtype == DType.f32, f"a must be an f32 tensor of rank >= 2, got {a}")
    _need(
        w.rank == 2 and w.dtype == DType.f32,
        f"b must be the 2-D [N, K] f32 weight (llm.dequantize of the stored GGUF tensor), got {w}",
    )
    n, k = w.shape
    _need(
        k == a.shape[-1] or not (isinstance(k, int) and isinstance(a.shape[-1], int)),
        f"contraction dims differ: a has {a.shape[-1]}, b {k}",
    )
    fmt = ctx["format"]
    block = gguf_block_elems(fmt)
    _need(
        not isinstance(k, int) or k % block == 0,
        f"K = {k} is not a multiple of {fmt}'s {block}-element blocks",
    )
    return [_epilogue_out(a, n, ctx["epilogue"])]


def gguf_weight_problem(w: Any, fmt: str) -> str | None:
    """Why the value w is not what ort.matmul_gguf {format = fmt} reads (the llm.dequantize of a
    tensor stored as !quant.<fmt>, or a row-concatenation of such), or None. A value with no
    producer (a function argument) has nothing stored to check."""
    src = w.owner
    if src is None:
        return None
    if src.name == "core.concat" and src.attrs.get("axis") == 0:
        for part in src.operands:
            why = gguf_weight_problem(part, fmt) if part.owner is not None else "an argument"
            if why is not None:
                return why
        return None
    q = getattr(src.operands[0].type, "dtype", None) if src.operands else None
    if src.name == "llm.dequantize" and isinstance(q, QuantType) and q.scheme == fmt:
        return None
    return f"llm.dequantize of {q}" if src.name == "llm.dequantize" else src.name


def _ref_gguf(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    a, w = args
    y = a.astype(_F64) @ np.asarray(w, _F64).T
    if at.get("epilogue", "none") == "swiglu":
        y = _swiglu64(y)
    return y.astype(a.dtype)


register(
    OpDef(
        name="ort.matmul_gguf",
        summary="llmir's onnxruntime custom op (ai.llmir MatMulGGUF, llmir_core/targets/onnxruntime/native): "
        "a @ b^T where b is a GGUF tensor run as stored: the serializer writes the tensor's rows "
        "exactly as the file holds them (uint8 [N, row_bytes]) and the kernel decodes its blocks "
        "in place. b is the logical [N, K] f32 weight, the `llm.dequantize` of a stored "
        "`!quant.<format>` tensor, so the op's value is the product with exactly the block "
        "format's dequantized weight (llmir_core/quant/gguf_blocks.py, bit-identical with "
        "gguf.quants.dequantize): q4_0/q5_0/q8_0 d * q; q4_1/q5_1 d * q + m; q2_k/q4_k/q5_k "
        "(d * sc) * q - (dmin * m) with 6-bit (q2_k: 4-bit) sub-block scales and mins in "
        "256-element super-blocks; q3_k/q6_k (d * sc) * q with signed sub-block scales; "
        "iq4_nl/iq4_xs d * kvalues[q] (the non-linear 16-entry table; iq4_xs with 6-bit "
        "sub-block scales, offset 32). No rounding of the weight: the op is exact and "
        "decomposes to a matmul. At run time the kernel rounds the rows of a to int8 per "
        "32-block (decode and prefill alike), the activation precision of MatMulNBits' "
        "accuracy_level 4, of llmir's nbits kernel and of llama.cpp's quantized matmuls; the "
        "block dot products are integers, scaled and summed in f32. epilogue "
        '"swiglu": b is [W_gate; W_up] '
        "(both of the format) and the result is silu(a @ W_gate^T) * (a @ W_up^T), half of N "
        "wide.",
        operands=(
            Operand("a", doc="[..., K] f32"),
            Operand("b", doc="[N, K] f32: llm.dequantize of the stored GGUF tensor"),
        ),
        attrs=(
            Attr(
                "format",
                "str",
                choices=GGUF_FORMATS,
                doc="the stored tensor's GGUF block format (gguf_blocks scheme name)",
            ),
            _epilogue_attr(),
        ),
        infer=_infer_gguf,
        reference=_ref_gguf,
        decompose=lambda b, o, at: [
            _dec_epilogue(
                b,
                b.op("core.matmul", o[0], o[1], transpose_b=True),
                at.get("epilogue", "none"),
            )
        ],
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_matmul_gguf"),
        interval=_iv_weight_matmul,
        cost=_cost_qmm,
        verifies="a is an f32 tensor of rank >= 2, b a 2-D f32 [N, K] weight whose K matches a's "
        "last dim and is a multiple of the format's block (256 elements for k-quants and iq4_xs, "
        'else 32); epilogue "swiglu" needs a static, even N; the module verifier also checks '
        "that b is the llm.dequantize of a tensor stored in that format (or a row-concatenation "
        "of such).",
        example='%y = ort.matmul_gguf %x, %w {format = "q4_k"} : (tensor<?batch x ?seq x 256 x f32>, '
        "tensor<8x256xf32>) -> tensor<?batch x ?seq x 8 x f32>",
    )
)


_QGEMM_WEIGHTS = ("s8pair", "u8")


def _infer_dqmm(ctx: InferCtx) -> list[Type]:
    a = float_tensor(ctx, 0, "a")
    w = tensor_arg(ctx, 1, "b")
    _need(a.dtype == DType.f32, f"a must be f32, got {a.dtype}")
    _need(a.rank >= 2, f"a must have rank >= 2, got {a}")
    _need(w.rank == 2 and w.dtype == DType.f32, f"b must be a 2-D [N, K] f32 weight, got {w}")
    n, k = w.shape
    _need(
        k == a.shape[-1] or not (isinstance(k, int) and isinstance(a.shape[-1], int)),
        f"contraction dims differ: a has {a.shape[-1]}, b {k}",
    )
    return [like(a, (*a.shape[:-1], n))]


def qgemm_weight(w: np.ndarray, weights: str) -> tuple[np.ndarray, np.ndarray]:
    """The int8 codes [N, K] and per-row f32 scales `ort.dynamic_quantize_matmul` stores for the
    float weight w [N, K] (llmir_core/quant/qgemm.py)."""
    from llmir_core.quant import qgemm

    return qgemm.quantize_rows(w, pairs=weights == "s8pair")


def _ref_dqmm(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    from llmir_core.quant import qgemm

    a, w = args
    codes, scales = qgemm_weight(np.asarray(w, np.float32), at["weights"])
    return qgemm.matmul(a, codes, scales).astype(a.dtype)


register(
    OpDef(
        name="ort.dynamic_quantize_matmul",
        summary="com.microsoft.DynamicQuantizeMatMul: a @ b^T with b rounded to int8 per output "
        "channel (symmetric: one f32 scale per row) and a quantized to uint8 at run "
        "time per tensor (ONNX DynamicQuantizeLinear: scale (max(a, 0) - min(a, 0)) / 255, "
        "round half to even), the integer products summed exactly and scaled back (MLAS "
        "QGEMM). b is the logical [N, K] f32 weight; the serializer quantizes it. `weights` "
        'is how the codes are stored: "s8pair" (int8, the scale chosen so each adjacent pair '
        "of codes has |q[2i]| + |q[2i+1]| <= 128: MLAS's u8s8 kernels, whose AVX2 form adds "
        'u8 x s8 products pairwise in saturating 16-bit lanes, stay exact) or "u8" (L = '
        "max|row|, codes + 128 with zero point 128: MLAS's slower u8u8 kernel).",
        operands=(
            Operand("a", doc="[..., K] f32"),
            Operand("b", doc="[N, K] f32 weight"),
        ),
        attrs=(
            Attr(
                "weights",
                "str",
                "s8pair",
                choices=_QGEMM_WEIGHTS,
                doc="s8pair (int8 codes, adjacent pairs' magnitudes summing to <= 128) or u8 "
                "(codes within +-127 of max|row|, stored + 128 with zero point 128)",
            ),
        ),
        infer=_infer_dqmm,
        reference=_ref_dqmm,
        no_smt="it rounds its weight and its activations (a per-tensor range computed at run "
        "time): translation validation compares it differentially",
        cost=ranges.cost_matmul,
        verifies="a is an f32 tensor of rank >= 2 and b a 2-D f32 [N, K] weight whose K matches a's "
        "last dim.",
        example='%y = ort.dynamic_quantize_matmul %x, %w {weights = "u8"} : '
        "(tensor<?batch x ?seq x 64 x f32>, tensor<128x64xf32>) -> tensor<?batch x ?seq x 128 x f32>",
    )
)


def _infer_matmul_s8(ctx: InferCtx) -> list[Type]:
    a = _infer_dqmm(ctx)[0]
    assert isinstance(a, TensorType)
    return [_epilogue_out(a, a.shape[-1], ctx["epilogue"])]


def _ref_matmul_s8(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    from llmir_core.quant import s8

    a, w = args
    codes, scales = s8.quantize_rows(np.asarray(w, np.float32))
    y = s8.matmul(a, codes, scales)
    if at.get("epilogue", "none") == "swiglu":
        return _swiglu64(y.astype(_F64)).astype(a.dtype)
    return y.astype(a.dtype)


register(
    OpDef(
        name="ort.matmul_s8",
        summary="llmir's onnxruntime custom op (ai.llmir MatMulS8, llmir_core/targets/onnxruntime/native): "
        "a @ b^T with b rounded to int8 per output channel (symmetric, scale max|row| / 127) and "
        "read in place, rows interleaved by 4 (no prepacking). a is rounded per block of 32 "
        "columns at run time: with at most 4 rows (decode) to int8 (scale max|block| / 127, as "
        "llama.cpp's q8_0), with more (prefill) to 7-bit unsigned codes with a zero point over "
        "the block's range; the integer products are summed exactly per block and scaled back "
        "(llmir_core/quant/s8.py). b is the logical [N, K] f32 weight; the serializer quantizes "
        'it. epilogue "swiglu": b is [W_gate; W_up] and the result is silu(a @ W_gate^T) * '
        "(a @ W_up^T), half of N wide.",
        operands=(
            Operand("a", doc="[..., K] f32"),
            Operand("b", doc="[N, K] f32 weight"),
        ),
        attrs=(_epilogue_attr(),),
        infer=_infer_matmul_s8,
        reference=_ref_matmul_s8,
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_matmul_s8"),
        cost=_cost_qmm,
        verifies="a is an f32 tensor of rank >= 2 and b a 2-D f32 [N, K] weight whose K matches a's "
        'last dim; epilogue "swiglu" needs a static, even N.',
        example="%y = ort.matmul_s8 %x, %w : "
        "(tensor<?batch x ?seq x 64 x f32>, tensor<128x64xf32>) -> tensor<?batch x ?seq x 128 x f32>",
    )
)


# -- quantized embedding lookup -------------------------------------------------------------------


def _infer_gbq(ctx: InferCtx) -> list[Type]:
    table = float_tensor(ctx, 0, "table")
    ids = tensor_arg(ctx, 1, "ids")
    _need(table.rank == 2, f"table must be a 2-D [vocab, hidden] weight, got {table}")
    _need(
        isinstance(ids.dtype, DType) and ids.dtype.is_int, f"ids must be integers, got {ids.dtype}"
    )
    bits, block = ctx["bits"], ctx["block_size"]
    _need(bits in (4, 8), f"bits must be 4 or 8, got {bits}")
    _need(
        block >= 16 and block & (block - 1) == 0,
        f"block_size must be a power of two >= 16, got {block}",
    )
    h = table.shape[1]
    if isinstance(h, int):
        _need(h % block == 0, f"hidden = {h} is not a multiple of block_size {block}")
    _need(
        ctx["scale_dtype"] == "f32" or ctx["quantize"] != "none",
        'scale_dtype "f16" applies to a quantizing op (quantize sym)',
    )
    return [like(table, (*ids.shape, h))]


def _ref_gbq(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    table, ids = args
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise IndexError(
            f"token id out of range [0, {table.shape[0]}): "
            f"min {int(ids.min())}, max {int(ids.max())}"
        )
    rows = np.take(np.asarray(table), ids.reshape(-1), axis=0)
    if at["quantize"] != "none":  # row by row: the blocks run along a row
        rows = fake_quant(
            rows, at["bits"], at["block_size"], at["quantize"], at.get("scale_dtype", "f32")
        )
    return rows.astype(table.dtype).reshape(*ids.shape, table.shape[1])


def _dec_gbq(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    """A lookup in the table as stored: rounded to blocks along its rows first (`quantize`
    sym: quantizing the table then gathering rows is gathering then quantizing them)."""
    table = o[0]
    if at["quantize"] != "none":
        parts = requantized(b, table, at)
        table = b.op("llm.dequantize", *parts, dtype=table.type.dtype)
    return [b.op("llm.embedding", table, o[1])]


register(
    OpDef(
        name="ort.gather_block_quantized",
        summary="com.microsoft.GatherBlockQuantized: rows of an embedding table stored as "
        "bits-bit blocks of block_size along its rows (result[..., :] = table[ids[...], :]). The "
        "table is the logical [vocab, hidden] float weight, which the serializer packs exactly "
        "as `ort.matmul_nbits` packs it (a tied lm_head's blocks are stored once, for both); "
        'quantize "none" means the packing is lossless (a GGUF block format), "sym" that the '
        "rows are rounded to symmetric blocks.",
        operands=(
            Operand("table", doc="[vocab, hidden] float weight"),
            Operand("ids", doc="integer token ids"),
        ),
        attrs=(
            Attr("bits", "int", doc="4 or 8"),
            Attr("block_size", "int", doc="elements per block along a row"),
            Attr(
                "quantize",
                "str",
                "none",
                choices=("none", "sym"),
                doc="none (lossless repack) or sym (rounded to symmetric blocks)",
            ),
            _scale_dtype_attr(),
        ),
        infer=_infer_gbq,
        reference=_ref_gbq,
        decompose=_dec_gbq,
        verifies="table is a 2-D float weight whose row length is a multiple of block_size, ids "
        "an integer tensor, bits is 4 or 8 and block_size a power of two >= 16; the result is "
        "[*ids.shape, hidden].",
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_gather_block_quantized"),
        example="%h = ort.gather_block_quantized %table, %ids {bits = 8, block_size = 32} : "
        "(tensor<128x64xf32>, tensor<?batch x ?seq x i64>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)


# -- norms and activations -----------------------------------------------------------------------------


def _infer_sln(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    skip = len(ctx.types) == 3
    if skip:
        s = tensor_arg(ctx, 1, "skip")
        _need(s.dtype == x.dtype and s.rank == x.rank, f"skip must have x's type {x}, got {s}")
    w = tensor_arg(ctx, len(ctx.types) - 1, "weight")
    _need(x.rank >= 1, "x must have rank >= 1")
    _need(w.rank == 1 and w.dtype == x.dtype, f"weight must be 1-D {x.dtype}, got {w}")
    _need(
        w.shape[0] == x.shape[-1]
        or not isinstance(w.shape[0], int)
        or not isinstance(x.shape[-1], int),
        f"weight has {w.shape[0]} elements but x's last dim is {x.shape[-1]}",
    )
    _need(ctx["epsilon"] >= 0, f"epsilon must be >= 0, got {ctx['epsilon']}")
    _need(
        ctx["kernel"] != "llmir" or x.dtype == DType.f32,
        f'kernel "llmir" takes f32 x, got {x.dtype}',
    )
    return [x, x] if skip else [x]


NORM_KERNELS = ("onnxruntime", "llmir")  # the norm ops' `kernel`


def _norm_kernel_attr() -> Attr:
    return Attr(
        "kernel",
        "str",
        "onnxruntime",
        choices=NORM_KERNELS,
        doc="onnxruntime (com.microsoft's op) or llmir (ai.llmir's op of the same name and "
        "interface from llmir's custom-op library: AVX2, f32)",
    )


def _rms_attrs(at: dict[str, Any]) -> dict[str, Any]:
    return {"eps": at["epsilon"], "offset": at["offset"]}


register(
    OpDef(
        name="ort.simplified_layer_norm",
        summary="SimplifiedLayerNormalization (RMS norm over the last dim): x / sqrt(mean(x^2) + "
        "epsilon) * (weight + offset); the serializer folds offset into the scale initializer.",
        operands=(Operand("x"), Operand("weight", doc="[hidden]")),
        attrs=(
            Attr("epsilon", "float", 1e-6),
            Attr("offset", "float", 0.0, doc="added to weight (gemma)"),
            _norm_kernel_attr(),
        ),
        infer=_infer_sln,
        reference=lambda a, at: _ref_rms_norm(a, _rms_attrs(at)),
        decompose=lambda b, o, at: [b.op("llm.rms_norm", o[0], o[1], **_rms_attrs(at))],
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_simplified_layer_norm"),
        interval=ranges.iv_norm,
        cost=ranges.cost_per_element(4),
        verifies="x is a float tensor, weight 1-D of its dtype over the last dim, epsilon >= 0, "
        'kernel "llmir" takes f32.',
        example="%y = ort.simplified_layer_norm %x, %w {epsilon = 1e-05} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<64xf32>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)


def _ref_skip_sln(args: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    x, skip, w = args
    s = (x.astype(_F64) + skip.astype(_F64)).astype(x.dtype)
    return [_ref_rms_norm([s, w], _rms_attrs(at)), s]


def _dec_skip_sln(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    s = b.op("core.add", o[0], o[1])
    return [b.op("llm.rms_norm", s, o[2], **_rms_attrs(at)), s]


register(
    OpDef(
        name="ort.skip_simplified_layer_norm",
        summary="com.microsoft.SkipSimplifiedLayerNormalization: sum = x + skip; normed = RMS norm of "
        "sum * (weight + offset). Returns (normed, sum) (the residual stream continues from sum).",
        operands=(
            Operand("x"),
            Operand("skip", doc="x's shape"),
            Operand("weight", doc="[hidden]"),
        ),
        attrs=(
            Attr("epsilon", "float", 1e-6),
            Attr("offset", "float", 0.0, doc="added to weight (gemma)"),
            _norm_kernel_attr(),
        ),
        infer=_infer_sln,
        reference=_ref_skip_sln,
        decompose=_dec_skip_sln,
        results=("normed", "sum"),
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_skip_simplified_layer_norm"),
        interval=ranges.iv_add_norm,
        cost=ranges.cost_add_norm,
        verifies="x and skip share a float type, weight is 1-D of its dtype over the last dim, "
        'epsilon >= 0, kernel "llmir" takes f32.',
        example="%y, %s = ort.skip_simplified_layer_norm %x, %r, %w {epsilon = 1e-05} : "
        "(tensor<?batch x ?seq x 64 x f32>, tensor<?batch x ?seq x 64 x f32>, tensor<64xf32>) -> "
        "(tensor<?batch x ?seq x 64 x f32>, tensor<?batch x ?seq x 64 x f32>)",
    )
)


def _ref_quick_gelu(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x = args[0].astype(_F64)
    with np.errstate(over="ignore"):
        return (x / (1.0 + np.exp(-at["alpha"] * x))).astype(args[0].dtype)


def _dec_quick_gelu(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    if at["alpha"] == 1.0:
        return [b.op("core.silu", o[0])]
    from llmir_core.dialects.llm import _scalar

    ax = b.op("core.mul", o[0], _scalar(b, at["alpha"], o[0].type.dtype))
    return [b.op("core.mul", o[0], b.op("core.sigmoid", ax))]


register(
    OpDef(
        name="ort.quick_gelu",
        summary="com.microsoft.QuickGelu: x * sigmoid(alpha * x) (alpha 1 is SiLU).",
        operands=(Operand("x"),),
        attrs=(Attr("alpha", "float", 1.0),),
        infer=lambda ctx: [float_tensor(ctx, 0, "x")],
        reference=_ref_quick_gelu,
        decompose=_dec_quick_gelu,
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_quick_gelu"),
        verifies="x is a float tensor.",
        example="%y = ort.quick_gelu %x : (tensor<?batch x ?seq x 256 x f32>) -> tensor<?batch x ?seq x 256 x f32>",
    )
)


def _infer_ort_cast(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    to = ctx["to"]
    _need(isinstance(to, DType) and to.is_float, f"ort.cast: `to` must be a float dtype, got {to}")
    return [like(x, dtype=to)]


def _ref_ort_cast(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    from llmir_core.dialects.core import _cast

    return _cast(args[0], at["to"])


register(
    OpDef(
        name="ort.cast",
        summary="A Cast node onnxruntime executes between float dtypes. On a constant it runs "
        "once, when the session loads: the constant is stored in its own (16-bit) dtype in the "
        "artifact and widened in memory (what `--dtype f16|bf16` does with matmul weights).",
        operands=(Operand("x"),),
        attrs=(Attr("to", "dtype", doc="target float dtype"),),
        infer=_infer_ort_cast,
        reference=_ref_ort_cast,
        decompose=lambda b, o, at: [b.op("core.cast", o[0], to=at["to"])],
        verifies="x is a float tensor and `to` a float dtype.",
        traits=frozenset({"elementwise"}),
        smt=encoding("core_smt", "cast"),
        example="%w = ort.cast %w16 {to = f32} : (tensor<64x64xf16>) -> tensor<64x64xf32>",
    )
)


# -- weight packing (pack-ort-weights) ---------------------------------------------------------------

PACK_FORMATS = ("panel16", "nbits")  # ort.pack's `format`: how the serializer stores the weight


def _infer_pack(ctx: InferCtx) -> list[Type]:
    w = float_tensor(ctx, 0, "w")
    _need(w.rank == 2, f"w must be a 2-D [N, K] weight, got {w}")
    fmt, k = ctx["format"], w.shape[1]
    if fmt == "panel16":
        _need(w.dtype == DType.f32, f'format "panel16" stores f32 rows, got {w.dtype}')
        _need(ctx["quantize"] == "none", 'format "panel16" is lossless: quantize must be "none"')
        return [w]
    bits, block = ctx["bits"], ctx["block_size"]
    _need(bits in (4, 8), f"bits must be 4 or 8, got {bits}")
    _need(
        block >= 16 and block & (block - 1) == 0,
        f"block_size must be a power of two >= 16, got {block}",
    )
    if isinstance(k, int):
        _need(k % block == 0, f"K = {k} is not a multiple of block_size {block}")
    _need(
        ctx["scale_dtype"] == "f32" or ctx["quantize"] != "none",
        'scale_dtype "f16" applies to a quantizing pack (quantize sym/asym)',
    )
    _need(
        not (ctx["quantize"] == "sym" and ctx["zero_points"]),
        'quantize "sym" stores no zero points (zero_points = true needs "asym" or "none")',
    )
    return [w]


def _ref_pack(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    w = args[0]
    if at["format"] == "nbits" and at["quantize"] != "none":
        q = fake_quant(w, at["bits"], at["block_size"], at["quantize"], at["scale_dtype"])
        return q.astype(w.dtype)
    return w


def _dec_pack(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    """The stored weight's value: w itself (a lossless format), or w rounded to the blocks
    (`llm.quantize` then `llm.dequantize`)."""
    if at["format"] != "nbits" or at["quantize"] == "none":
        return [o[0]]
    parts = requantized(b, o[0], at)
    return [b.op("llm.dequantize", *parts, dtype=o[0].type.dtype)]


register(
    OpDef(
        name="ort.pack",
        summary="A weight as the artifact stores it (inserted by pack-ort-weights; the serializer "
        "writes each ort.pack as its initializers, 1:1). The result is the value the stored "
        'bytes mean, of w\'s type. format "panel16": [ceil(N/16), K, 16] f32 panels '
        "(llmir_core/targets/onnxruntime/panels.py, ort.matmul_f32's layout), the value is w. "
        'format "nbits": MatMulNBits blocks of `bits` over `block_size` columns (scales, and '
        'zero points with `zero_points`); quantize "none" means the blocks hold w exactly (a '
        'GGUF, nbits or checkpoint-packed source repacked), "sym"/"asym" that w is '
        "rounded to them (the value is the rounded weight; scale_dtype f16 rounds the scales).",
        operands=(Operand("w", doc="[N, K] float weight"),),
        attrs=(
            Attr("format", "str", choices=PACK_FORMATS, doc="panel16 or nbits"),
            Attr("bits", "int", 4, doc="nbits: 4 or 8"),
            Attr("block_size", "int", 32, doc="nbits: elements per block along K"),
            Attr("zero_points", "bool", False, doc="nbits: integer zero points are stored"),
            Attr(
                "quantize",
                "str",
                "none",
                choices=_QUANTIZE,
                doc="nbits: none (w is stored exactly), sym or asym (w is rounded to blocks)",
            ),
            _scale_dtype_attr(),
        ),
        infer=_infer_pack,
        reference=_ref_pack,
        decompose=_dec_pack,
        smt=encoding("llmir_core.targets.onnxruntime.smt", "ort_pack"),
        verifies="w is a 2-D float weight; panel16 takes f32 and is lossless; nbits has bits 4 "
        "or 8, a power-of-two block_size >= 16 dividing K, scale_dtype f16 only when quantizing "
        'and no zero points with quantize "sym".',
        example='%p = ort.pack %w {format = "nbits", bits = 4, block_size = 32, quantize = "sym"} '
        ": (tensor<128x64xf32>) -> tensor<128x64xf32>",
    )
)


__all__ = ["fake_quant", "kv_int8_codes", "GGUF_FORMATS", "gguf_block_elems", "gguf_weight_problem"]
