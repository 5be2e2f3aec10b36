"""The `llm` dialect: embedding, norms, rotary, attention, gated MLP, KV cache, quantization.

Composite ops (norms, rotary, attention, silu_mul, gated_mlp, quantized_matmul, embedding)
declare a decomposition into core ops; their references compute in float64 and round once to
the operand dtype, while the decompositions run in the operand dtype (f32 for f16/bf16/f8
operands, cast back at the end), so the two agree to float32 rounding.

A `!llm.kv_cache` value at run time is a `KVCacheValue`: keys and values of shape
[layers, batch, kv_heads, max_len, head_dim]. Cache ops are functional — `kv_cache_update`
returns a new cache value as an SSA result (so dead-code elimination can never drop a write)
and is marked `effects`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.dims import DYN, Dim, SymDim, dim_div_exact
from llmir_core.ir.types import DType, KVCacheType, QuantType, TensorType, Type, numpy_dtype

from . import ranges
from .opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError, encoding
from .registry import register, register_dialect
from .shapes import broadcast_shapes, float_tensor, fmt_shape, kv_arg, like, tensor_arg

register_dialect(
    "llm", "language-model ops: embedding, norms, rotary, attention, KV cache, quantization"
)

_F64 = np.float64
_LOW_PRECISION = {DType.f16, DType.bf16, DType.f8e4m3, DType.f8e5m2}


# -- shared helpers --------------------------------------------------------------------------


def _same(a: Dim, b: Dim) -> bool:
    """False only when a and b are known to differ (two different ints, or int vs symbol)."""
    if a is DYN or b is DYN:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, SymDim) and isinstance(b, SymDim):
        return True  # different expressions may still agree at run time
    return False


def _need_rank(t: TensorType, rank: int, what: str) -> None:
    if t.rank != rank:
        raise OpVerifyError(f"{what} must have rank {rank}, got {t}")


def _need_dtype(t: TensorType, dt: Any, what: str) -> None:
    if t.dtype != dt:
        raise OpVerifyError(f"{what} has dtype {t.dtype}, expected {dt} (insert core.cast)")


def _need_dim(a: Dim, b: Dim, msg: str) -> None:
    if not _same(a, b):
        raise OpVerifyError(msg)


def _int_scalar(ctx: InferCtx, i: int, what: str) -> TensorType:
    t = tensor_arg(ctx, i, what)
    if t.rank != 0 or not isinstance(t.dtype, DType) or not t.dtype.is_int:
        raise OpVerifyError(f"{what} must be an integer scalar (tensor<i64>), got {t}")
    return t


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(_F64)


def _scalar(b: Any, value: float | int, dt: DType) -> Any:
    arr = np.array(value, dtype=numpy_dtype(dt))
    return b.op("core.constant", value=DenseAttr(arr, TensorType((), dt)))


def _work(b: Any, v: Any) -> tuple[Any, DType]:
    """The value in its working dtype (low-precision floats compute in f32) and the original."""
    dt = v.type.dtype
    if dt in _LOW_PRECISION:
        return b.op("core.cast", v, to=DType.f32), dt
    return v, dt


def _back(b: Any, v: Any, dt: DType) -> Any:
    return b.op("core.cast", v, to=dt) if v.type.dtype != dt else v


# -- embedding ---------------------------------------------------------------------------------


def _infer_embedding(ctx: InferCtx) -> list[Type]:
    table = float_tensor(ctx, 0, "table")
    ids = tensor_arg(ctx, 1, "ids")
    _need_rank(table, 2, "table")
    if not isinstance(ids.dtype, DType) or not ids.dtype.is_int:
        raise OpVerifyError(f"ids must be integers, got {ids.dtype}")
    return [like(table, (*ids.shape, table.shape[1]))]


def _ref_embedding(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    table, ids = args
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise IndexError(
            f"token id out of range [0, {table.shape[0]}): "
            f"min {int(ids.min())}, max {int(ids.max())}"
        )
    return np.take(table, ids, axis=0)


register(
    OpDef(
        name="llm.embedding",
        summary="Look up rows of an embedding table: result[..., :] = table[ids[...], :] (ids in [0, vocab)).",
        operands=(Operand("table", doc="[vocab, hidden]"), Operand("ids", doc="integer token ids")),
        attrs=(),
        infer=_infer_embedding,
        reference=_ref_embedding,
        decompose=lambda b, o, at: [b.op("core.gather", o[0], o[1], axis=0)],
        smt=encoding("llm_smt", "embedding"),
        interval=ranges.iv_first,
        verifies="table is a 2-D float tensor, ids an integer tensor; the result is [*ids.shape, hidden].",
        example="%h = llm.embedding %table, %ids : (tensor<128x64xf32>, tensor<?batch x ?seq x i64>) "
        "-> tensor<?batch x ?seq x 64 x f32>",
    )
)


# -- norms -----------------------------------------------------------------------------------


def _infer_norm(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1 (the normalized dim is the last)")
    for i in range(1, len(ctx.types)):
        what = ("weight", "bias")[i - 1]
        w = tensor_arg(ctx, i, what)
        _need_rank(w, 1, what)
        _need_dtype(w, x.dtype, what)
        _need_dim(
            w.shape[0],
            x.shape[-1],
            f"{what} has {w.shape[0]} elements but x's last dim is {x.shape[-1]}",
        )
    if ctx["eps"] < 0:
        raise OpVerifyError(f"eps must be >= 0, got {ctx['eps']}")
    return [x]


def _ref_rms_norm(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, w = args
    xf = _f64(x)
    inv = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + at["eps"])
    return (xf * inv * (_f64(w) + at["offset"])).astype(x.dtype)


def _dec_rms_norm(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    x, dt = _work(b, o[0])
    w, _ = _work(b, o[1])
    wt = x.type.dtype
    ms = b.op("core.reduce_mean", b.op("core.mul", x, x), axes=(-1,), keepdims=True)
    inv = b.op("core.rsqrt", b.op("core.add", ms, _scalar(b, at["eps"], wt)))
    if at["offset"] != 0.0:
        w = b.op("core.add", w, _scalar(b, at["offset"], wt))
    y = b.op("core.mul", b.op("core.mul", x, inv), w)
    return [_back(b, y, dt)]


register(
    OpDef(
        name="llm.rms_norm",
        summary="RMS normalization over the last dim: x / sqrt(mean(x^2) + eps) * (weight + offset).",
        operands=(Operand("x"), Operand("weight", doc="[hidden]")),
        attrs=(
            Attr("eps", "float", 1e-6, doc="added to the mean square"),
            Attr(
                "offset", "float", 0.0, doc="added to weight (gemma stores weight - 1: offset 1.0)"
            ),
        ),
        infer=_infer_norm,
        reference=_ref_rms_norm,
        decompose=_dec_rms_norm,
        smt=encoding("llm_smt", "rms_norm"),
        interval=ranges.iv_norm,
        cost=ranges.cost_per_element(4),
        verifies="x is a float tensor, weight is 1-D with x's dtype and last dim, and eps >= 0.",
        example="%y = llm.rms_norm %x, %w {eps = 1e-05} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<64xf32>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)


def _ref_layer_norm(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, w = args[0], args[1]
    xf = _f64(x)
    c = xf - xf.mean(axis=-1, keepdims=True)
    y = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + at["eps"]) * _f64(w)
    if len(args) > 2:
        y = y + _f64(args[2])
    return y.astype(x.dtype)


def _dec_layer_norm(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    x, dt = _work(b, o[0])
    w, _ = _work(b, o[1])
    mean = b.op("core.reduce_mean", x, axes=(-1,), keepdims=True)
    c = b.op("core.sub", x, mean)
    var = b.op("core.reduce_mean", b.op("core.mul", c, c), axes=(-1,), keepdims=True)
    inv = b.op("core.rsqrt", b.op("core.add", var, _scalar(b, at["eps"], x.type.dtype)))
    y = b.op("core.mul", b.op("core.mul", c, inv), w)
    if len(o) > 2:
        y = b.op("core.add", y, _work(b, o[2])[0])
    return [_back(b, y, dt)]


register(
    OpDef(
        name="llm.layer_norm",
        summary="Layer normalization over the last dim: (x - mean) / sqrt(var + eps) * weight + bias.",
        operands=(
            Operand("x"),
            Operand("weight", doc="[hidden]"),
            Operand("bias", optional=True, doc="[hidden]"),
        ),
        attrs=(Attr("eps", "float", 1e-5, doc="added to the (population) variance"),),
        infer=_infer_norm,
        reference=_ref_layer_norm,
        decompose=_dec_layer_norm,
        smt=encoding("llm_smt", "layer_norm"),
        interval=ranges.iv_norm,
        cost=ranges.cost_per_element(4),
        verifies="x is a float tensor, weight (and bias) are 1-D with x's dtype and last dim, eps >= 0.",
        example="%y = llm.layer_norm %x, %w, %b : (tensor<?batch x ?seq x 64 x f32>, tensor<64xf32>, "
        "tensor<64xf32>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)


# -- rotary embedding --------------------------------------------------------------------------


def _infer_rotary(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    cos, sin = tensor_arg(ctx, 1, "cos_cache"), tensor_arg(ctx, 2, "sin_cache")
    pos = tensor_arg(ctx, 3, "positions")
    _need_rank(x, 4, "x ([batch, heads, seq, head_dim])")
    for t, what in ((cos, "cos_cache"), (sin, "sin_cache")):
        _need_rank(t, 2, f"{what} ([max_pos, rotary_dim/2])")
        _need_dtype(t, x.dtype, what)
    _need_dim(cos.shape[0], sin.shape[0], "cos_cache and sin_cache have different lengths")
    _need_dim(cos.shape[1], sin.shape[1], "cos_cache and sin_cache have different widths")
    _need_rank(pos, 2, "positions ([batch, seq])")
    if pos.dtype != DType.i64:
        raise OpVerifyError(f"positions must be i64, got {pos.dtype}")
    if pos.shape[0] != 1:
        _need_dim(
            pos.shape[0],
            x.shape[0],
            f"positions batch {pos.shape[0]} differs from x's {x.shape[0]}",
        )
    _need_dim(
        pos.shape[1], x.shape[2], f"positions seq {pos.shape[1]} differs from x's {x.shape[2]}"
    )
    rd = ctx["rotary_dim"]
    head = x.shape[3]
    if rd < 0 or rd % 2:
        raise OpVerifyError(f"rotary_dim must be even and >= 0, got {rd}")
    if rd and isinstance(head, int) and rd > head:
        raise OpVerifyError(f"rotary_dim {rd} exceeds head_dim {head}")
    if not rd and isinstance(head, int) and head % 2:
        raise OpVerifyError(f"head_dim {head} is odd; rotary needs an even rotary_dim")
    half = rd // 2 if rd else (head // 2 if isinstance(head, int) else DYN)
    _need_dim(cos.shape[1], half, f"cos_cache width {cos.shape[1]} is not rotary_dim/2 = {half}")
    return [x]


def _ref_rotary(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, cos, sin, pos = args
    rd = at["rotary_dim"] or x.shape[-1]
    half = rd // 2
    if pos.size and (pos.min() < 0 or pos.max() >= cos.shape[0]):
        raise IndexError(
            f"position out of range [0, {cos.shape[0]}): min {int(pos.min())}, max {int(pos.max())}"
        )
    c, s = _f64(cos)[pos][:, None], _f64(sin)[pos][:, None]  # [batch, 1, seq, half]
    xf = _f64(x)
    xr, keep = xf[..., :rd], xf[..., rd:]
    x1, x2 = (
        (xr[..., 0::2], xr[..., 1::2]) if at["interleaved"] else (xr[..., :half], xr[..., half:])
    )
    real, imag = c * x1 - s * x2, s * x1 + c * x2
    if at["interleaved"]:
        rot = np.stack([real, imag], axis=-1).reshape(xr.shape)
    else:
        rot = np.concatenate([real, imag], axis=-1)
    return np.concatenate([rot, keep], axis=-1).astype(x.dtype)


def _dec_rotary(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    head = o[0].type.shape[3]
    if not isinstance(head, int):
        raise OpVerifyError("decomposing llm.rotary_embedding needs a static head_dim")
    x, dt = _work(b, o[0])
    cos_c, _ = _work(b, o[1])
    sin_c, _ = _work(b, o[2])
    rd = at["rotary_dim"] or head
    half = rd // 2
    cos = b.op("core.unsqueeze", b.op("core.gather", cos_c, o[3], axis=0), axes=(1,))
    sin = b.op("core.unsqueeze", b.op("core.gather", sin_c, o[3], axis=0), axes=(1,))

    def part(start: int, end: int, step: int = 1) -> Any:
        return b.op("core.slice", x, starts=(start,), ends=(end,), axes=(3,), steps=(step,))

    x1, x2 = (
        (part(0, rd, 2), part(1, rd, 2)) if at["interleaved"] else (part(0, half), part(half, rd))
    )
    real = b.op("core.sub", b.op("core.mul", cos, x1), b.op("core.mul", sin, x2))
    imag = b.op("core.add", b.op("core.mul", sin, x1), b.op("core.mul", cos, x2))
    if at["interleaved"]:
        pair = b.op(
            "core.concat",
            b.op("core.unsqueeze", real, axes=(4,)),
            b.op("core.unsqueeze", imag, axes=(4,)),
            axis=4,
        )
        rot = b.op("core.reshape", pair, shape=(0, 0, 0, rd))
    else:
        rot = b.op("core.concat", real, imag, axis=3)
    if rd < head:
        rot = b.op("core.concat", rot, part(rd, head), axis=3)
    return [_back(b, rot, dt)]


register(
    OpDef(
        name="llm.rotary_embedding",
        summary="Rotary position embedding (ONNX opset-23 RotaryEmbedding, 4-D form): rotate pairs "
        "of the first rotary_dim features by the angles cached at each token's position.",
        operands=(
            Operand("x", doc="[batch, heads, seq, head_dim]"),
            Operand("cos_cache", doc="[max_pos, rotary_dim/2]"),
            Operand("sin_cache", doc="[max_pos, rotary_dim/2]"),
            Operand("positions", doc="[batch, seq] i64 (batch may be 1)"),
        ),
        attrs=(
            Attr(
                "interleaved",
                "bool",
                False,
                doc="pairs are (2i, 2i+1) (GPT-J) instead of (i, i + rotary_dim/2) (GPT-NeoX/llama)",
            ),
            Attr("rotary_dim", "int", 0, doc="features rotated; 0 means all of head_dim"),
        ),
        infer=_infer_rotary,
        reference=_ref_rotary,
        decompose=_dec_rotary,
        smt=encoding("llm_smt", "rotary_embedding"),
        interval=ranges.iv_rotary,
        verifies="x is [batch, heads, seq, head_dim], the caches are [max_pos, rotary_dim/2] of x's "
        "dtype, positions is i64 [batch, seq], and rotary_dim is even and <= head_dim.",
        example="%y = llm.rotary_embedding %q, %cos, %sin, %pos : (tensor<?batch x 9 x ?seq x 64 x f32>, "
        "tensor<2048x32xf32>, tensor<2048x32xf32>, tensor<?batch x ?seq x i64>) "
        "-> tensor<?batch x 9 x ?seq x 64 x f32>",
    )
)


# -- attention ----------------------------------------------------------------------------------


def _infer_sdpa(ctx: InferCtx) -> list[Type]:
    q, k, v = float_tensor(ctx, 0, "q"), tensor_arg(ctx, 1, "k"), tensor_arg(ctx, 2, "v")
    for t, what in ((q, "q"), (k, "k"), (v, "v")):
        _need_rank(t, 4, f"{what} ([batch, heads, seq, head_dim])")
    _need_dtype(k, q.dtype, "k")
    _need_dtype(v, q.dtype, "v")
    bq, hq, sq, dq = q.shape
    bk, hk, sk, dk = k.shape
    _need_dim(bq, bk, f"q batch {bq} differs from k batch {bk}")
    _need_dim(bk, v.shape[0], "k and v batch sizes differ")
    _need_dim(hk, v.shape[1], f"k has {hk} heads but v has {v.shape[1]}")
    _need_dim(sk, v.shape[2], "k and v sequence lengths differ")
    _need_dim(dq, dk, f"q head_dim {dq} differs from k head_dim {dk}")
    if isinstance(hq, int) and isinstance(hk, int) and (hk == 0 or hq % hk):
        raise OpVerifyError(
            f"q heads ({hq}) must be a multiple of kv heads ({hk}) for grouped-query attention"
        )
    if len(ctx.types) > 3:
        m = tensor_arg(ctx, 3, "mask")
        if m.dtype not in (DType.bool, q.dtype):
            raise OpVerifyError(
                f"mask must be bool (true = keep) or additive {q.dtype}, got {m.dtype}"
            )
        target = (bq, hq, sq, sk)
        if m.rank > 4 or any(
            d != 1 and not _same(d, t) for d, t in zip(m.shape[::-1], target[::-1])
        ):
            raise OpVerifyError(
                f"mask {fmt_shape(m.shape)} does not broadcast to the scores {fmt_shape(target)}"
            )
    if ctx["sliding_window"] < 0:
        raise OpVerifyError(f"sliding_window must be >= 0, got {ctx['sliding_window']}")
    for key in ("softcap", "softmax_eps", "scale"):
        if ctx[key] < 0 or not math.isfinite(ctx[key]):
            raise OpVerifyError(f"{key} must be finite and >= 0, got {ctx[key]}")
    return [like(q, (bq, hq, sq, v.shape[3]))]


def _keep_positions(sq: int, skv: int, causal: bool, window: int) -> np.ndarray:
    """[sq, skv] keep-mask from causal / sliding-window (queries aligned to the end of keys)."""
    p = np.arange(sq)[:, None] + (skv - sq)
    j = np.arange(skv)[None, :]
    keep = np.ones((sq, skv), dtype=bool)
    if causal or window:
        keep &= j <= p
    if window:
        keep &= j > p - window
    return keep


def _ref_sdpa(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    q, k, v = args[:3]
    hq, hk, d = q.shape[1], k.shape[1], q.shape[3]
    if hk == 0 or hq % hk:
        raise ValueError(f"q heads ({hq}) is not a multiple of kv heads ({hk})")
    g = hq // hk
    kf, vf = np.repeat(_f64(k), g, axis=1), np.repeat(_f64(v), g, axis=1)
    scale = at["scale"] or 1.0 / math.sqrt(d)
    s = _f64(q) @ np.swapaxes(kf, -1, -2) * scale
    if at["softcap"]:
        s = at["softcap"] * np.tanh(s / at["softcap"])
    keep = _keep_positions(q.shape[2], k.shape[2], at["causal"], at["sliding_window"])
    if len(args) > 3:
        m = args[3]
        if m.dtype == np.bool_:
            keep = keep & m
        else:
            s = s + _f64(m)
    with np.errstate(invalid="ignore"):
        s = np.where(keep, s, -np.inf)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / (e.sum(axis=-1, keepdims=True) + at["softmax_eps"])
    return (p @ vf).astype(q.dtype)


def _positions_keep(b: Any, q: Any, k: Any, at: dict[str, Any]) -> Any:
    """The [sq, skv] causal / sliding-window keep-mask, built from the run-time lengths."""

    def length(x: Any) -> Any:
        return b.op("core.reshape", b.op("core.shape", x, start=2, end=3), shape=())

    sq, skv = length(q), length(k)
    zero, one = _scalar(b, 0, DType.i64), _scalar(b, 1, DType.i64)
    qi = b.create(
        "core.range", [zero, sq, one], result_types=[TensorType((q.type.shape[2],), DType.i64)]
    ).result
    kj = b.create(
        "core.range", [zero, skv, one], result_types=[TensorType((k.type.shape[2],), DType.i64)]
    ).result
    p = b.op("core.unsqueeze", b.op("core.add", qi, b.op("core.sub", skv, sq)), axes=(1,))
    keep = b.op("core.less_equal", kj, p)
    if at["sliding_window"]:
        lo = b.op("core.sub", p, _scalar(b, at["sliding_window"], DType.i64))
        keep = b.op("core.and", keep, b.op("core.greater", kj, lo))
    return keep


def _dec_sdpa(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    q, dt = _work(b, o[0])
    k, v = _work(b, o[1])[0], _work(b, o[2])[0]
    wt = q.type.dtype
    hq, hk, d = o[0].type.shape[1], o[1].type.shape[1], o[0].type.shape[3]
    if hq != hk:
        if not (isinstance(hq, int) and isinstance(hk, int)):
            raise OpVerifyError("decomposing grouped-query attention needs static head counts")
        idx = DenseAttr(np.arange(hq, dtype=np.int64) // (hq // hk), TensorType((hq,), DType.i64))
        heads = b.op("core.constant", value=idx)
        k, v = b.op("core.gather", k, heads, axis=1), b.op("core.gather", v, heads, axis=1)
    if not at["scale"] and not isinstance(d, int):
        raise OpVerifyError("decomposing attention with the default scale needs a static head_dim")
    scale = at["scale"] or 1.0 / math.sqrt(d)
    s = b.op("core.mul", b.op("core.matmul", q, k, transpose_b=True), _scalar(b, scale, wt))
    if at["softcap"]:
        cap = _scalar(b, at["softcap"], wt)
        s = b.op("core.mul", b.op("core.tanh", b.op("core.div", s, cap)), cap)
    neg_inf = _scalar(b, -np.inf, wt)
    if len(o) > 3:
        if o[3].type.dtype == DType.bool:
            s = b.op("core.where", o[3], s, neg_inf)
        else:
            s = b.op("core.add", s, _work(b, o[3])[0])
    if at["causal"] or at["sliding_window"]:
        s = b.op("core.where", _positions_keep(b, o[0], o[1], at), s, neg_inf)
    if at["softmax_eps"]:
        e = b.op(
            "core.exp", b.op("core.sub", s, b.op("core.reduce_max", s, axes=(-1,), keepdims=True))
        )
        den = b.op(
            "core.add",
            b.op("core.reduce_sum", e, axes=(-1,), keepdims=True),
            _scalar(b, at["softmax_eps"], wt),
        )
        p = b.op("core.div", e, den)
    else:
        p = b.op("core.softmax", s, axis=-1)
    return [_back(b, b.op("core.matmul", p, v), dt)]


register(
    OpDef(
        name="llm.scaled_dot_product_attention",
        summary="softmax(mask(softcap(q @ k^T * scale))) @ v, with grouped-query heads "
        "(kv head h serves q heads h*g .. h*g+g-1, g = Hq / Hkv), a causal and/or sliding-window "
        "mask aligned to the end of the keys (query i sits at position p = i + Skv - Sq; causal "
        "keeps keys j <= p, sliding_window W keeps p - W < j <= p), and an optional mask "
        "(bool: true = keep; float: added to the scores) broadcast to [B, Hq, Sq, Skv]. "
        "softcap c > 0 maps scores to c * tanh(scores / c) before masking (gemma2); "
        "softmax_eps is added to the softmax denominator; a query row with no visible key is NaN. "
        "verify_invariant is carried, not computed: an expression for a later verifier to "
        'check ("" = none).',
        operands=(
            Operand("q", doc="[B, Hq, Sq, D]"),
            Operand("k", doc="[B, Hkv, Skv, D]"),
            Operand("v", doc="[B, Hkv, Skv, Dv]"),
            Operand("mask", optional=True, doc="bool keep-mask or additive float"),
        ),
        attrs=(
            Attr("causal", "bool", False, doc="mask keys after each query's position"),
            Attr("scale", "float", 0.0, doc="score scale; 0 means 1/sqrt(D)"),
            Attr("softcap", "float", 0.0, doc="tanh soft-capping of the scores; 0 = off"),
            Attr(
                "sliding_window", "int", 0, doc="keys visible per query (p - W, p]; 0 = unlimited"
            ),
            Attr("softmax_eps", "float", 0.0, doc="added to the softmax denominator"),
            Attr(
                "verify_invariant",
                "str",
                "",
                doc='an expression a later verifier checks on this op; "" = none',
            ),
        ),
        infer=_infer_sdpa,
        reference=_ref_sdpa,
        decompose=_dec_sdpa,
        smt=encoding("llm_smt", "scaled_dot_product_attention"),
        interval=ranges.iv_operand(2),  # a convex combination of the rows of v
        cost=ranges.cost_attention,
        verifies="q, k, v are rank-4 tensors of one float dtype with matching batch, head_dim and kv "
        "lengths, Hq is a multiple of Hkv, the mask broadcasts to the scores, and "
        "scale/softcap/softmax_eps/sliding_window are >= 0.",
        example="%o = llm.scaled_dot_product_attention %q, %k, %v {causal = true} : "
        "(tensor<?batch x 9 x ?seq x 64 x f32>, tensor<?batch x 3 x ?past+?seq x 64 x f32>, "
        "tensor<?batch x 3 x ?past+?seq x 64 x f32>) -> tensor<?batch x 9 x ?seq x 64 x f32>",
    )
)


# -- gated MLP ----------------------------------------------------------------------------------


def _infer_silu_mul(ctx: InferCtx) -> list[Type]:  # operand kinds and dtypes: declared
    g, u = tensor_arg(ctx, 0), tensor_arg(ctx, 1)
    return [like(g, broadcast_shapes(g.shape, u.shape))]


def _silu64(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


register(
    OpDef(
        name="llm.silu_mul",
        summary="silu(gate) * up, elementwise with broadcasting (the SwiGLU product).",
        operands=(Operand("gate", kind="float"), Operand("up", kind="tensor", dtype_of="gate")),
        attrs=(),
        infer=_infer_silu_mul,
        reference=lambda a, at: (_silu64(_f64(a[0])) * _f64(a[1])).astype(a[0].dtype),
        decompose=lambda b, o, at: [b.op("core.mul", b.op("core.silu", o[0]), o[1])],
        smt=encoding("llm_smt", "silu_mul"),
        interval=ranges.iv_silu_mul,
        verifies="gate and up share a float dtype and broadcastable shapes.",
        traits=frozenset({"elementwise", "broadcast"}),
        example="%h = llm.silu_mul %g, %u : (tensor<?batch x ?seq x 256 x f32>, "
        "tensor<?batch x ?seq x 256 x f32>) -> tensor<?batch x ?seq x 256 x f32>",
    )
)

_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _act64(name: str, x: np.ndarray) -> np.ndarray:
    if name == "silu":
        return _silu64(x)
    if name == "gelu":
        erf = np.frompyfunc(math.erf, 1, 1)
        return 0.5 * x * (1.0 + np.asarray(erf(x / math.sqrt(2.0)), dtype=_F64))
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _infer_gated_mlp(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    wg, wu, wd = (tensor_arg(ctx, i, n) for i, n in ((1, "w_gate"), (2, "w_up"), (3, "w_down")))
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1")
    for t, n in ((wg, "w_gate"), (wu, "w_up"), (wd, "w_down")):
        _need_rank(t, 2, f"{n} ([out, in])")
        _need_dtype(t, x.dtype, n)
    _need_dim(
        wg.shape[1], x.shape[-1], f"w_gate takes {wg.shape[1]} inputs but x has {x.shape[-1]}"
    )
    _need_dim(wu.shape[1], x.shape[-1], f"w_up takes {wu.shape[1]} inputs but x has {x.shape[-1]}")
    _need_dim(
        wg.shape[0], wu.shape[0], f"w_gate has {wg.shape[0]} outputs but w_up has {wu.shape[0]}"
    )
    _need_dim(
        wd.shape[1],
        wg.shape[0],
        f"w_down takes {wd.shape[1]} inputs but the gate gives {wg.shape[0]}",
    )
    return [like(x, (*x.shape[:-1], wd.shape[0]))]


def _ref_gated_mlp(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, wg, wu, wd = (_f64(a) for a in args)
    h = _act64(at["activation"], x @ wg.T) * (x @ wu.T)
    return (h @ wd.T).astype(args[0].dtype)


def _dec_gated_mlp(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    x, wg, wu, wd = o
    gate = b.op("core.matmul", x, wg, transpose_b=True)
    act = at["activation"]
    if act == "silu":
        gate = b.op("core.silu", gate)
    else:
        gate = b.op("core.gelu", gate, approximate="none" if act == "gelu" else "tanh")
    h = b.op("core.mul", gate, b.op("core.matmul", x, wu, transpose_b=True))
    return [b.op("core.matmul", h, wd, transpose_b=True)]


register(
    OpDef(
        name="llm.gated_mlp",
        summary="Gated MLP with HF [out, in] weights: (act(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T.",
        operands=(
            Operand("x"),
            Operand("w_gate", doc="[inter, hidden]"),
            Operand("w_up", doc="[inter, hidden]"),
            Operand("w_down", doc="[hidden_out, inter]"),
        ),
        attrs=(
            Attr(
                "activation",
                "str",
                "silu",
                choices=_ACTIVATIONS,
                doc="silu (llama), gelu (exact erf) or gelu_tanh (gemma)",
            ),
        ),
        infer=_infer_gated_mlp,
        reference=_ref_gated_mlp,
        decompose=_dec_gated_mlp,
        smt=encoding("llm_smt", "gated_mlp"),
        interval=ranges.iv_gated_mlp,
        cost=ranges.cost_gated_mlp,
        verifies="the weights are 2-D [out, in] of x's dtype and their in/out dims chain "
        "x -> gate/up -> down.",
        example="%y = llm.gated_mlp %x, %wg, %wu, %wd : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<256x64xf32>, tensor<256x64xf32>, tensor<64x256xf32>) -> tensor<?batch x ?seq x 64 x f32>",
    )
)


# -- KV cache -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCacheValue:
    """The run-time value of a `!llm.kv_cache`: keys and values, each
    [layers, batch, kv_heads, max_len, head_dim]."""

    keys: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        if (
            self.keys.ndim != 5
            or self.keys.shape != self.values.shape
            or self.keys.dtype != self.values.dtype
        ):
            raise ValueError(
                f"KV cache keys {self.keys.shape} and values {self.values.shape} must "
                "share one 5-D shape and dtype"
            )

    @classmethod
    def empty(cls, t: KVCacheType, batch: int, max_len: int | None = None) -> KVCacheValue:
        """A zero-filled cache for type `t` (max_len from the type unless it is symbolic)."""
        n = t.max_len if isinstance(t.max_len, int) else max_len
        if n is None:
            raise ValueError(f"{t} has a symbolic max_len; pass max_len")
        shape = (t.layers, batch, t.kv_heads, n, t.head_dim)
        z = np.zeros(shape, dtype=numpy_dtype(t.dtype))
        return cls(z, z.copy())

    @property
    def batch(self) -> int:
        return int(self.keys.shape[1])

    @property
    def max_len(self) -> int:
        return int(self.keys.shape[3])


def _check_kv_layer(ctx: InferCtx, c: KVCacheType) -> None:
    if not 0 <= ctx["layer"] < c.layers:
        raise OpVerifyError(
            f"layer {ctx['layer']} is out of range for a cache of {c.layers} layers"
        )


def _infer_kv_update(ctx: InferCtx) -> list[Type]:
    c = kv_arg(ctx, 0)
    k, v = tensor_arg(ctx, 1, "k"), tensor_arg(ctx, 2, "v")
    _int_scalar(ctx, 3, "start")
    _check_kv_layer(ctx, c)
    for t, what in ((k, "k"), (v, "v")):
        _need_rank(t, 4, f"{what} ([batch, kv_heads, seq, head_dim])")
        _need_dtype(t, c.dtype, what)
        _need_dim(t.shape[1], c.kv_heads, f"{what} has {t.shape[1]} heads, the cache {c.kv_heads}")
        _need_dim(
            t.shape[3],
            c.head_dim,
            f"{what} head_dim {t.shape[3]} differs from the cache's {c.head_dim}",
        )
    for a, bb in zip(k.shape, v.shape):
        _need_dim(a, bb, f"k {fmt_shape(k.shape)} and v {fmt_shape(v.shape)} differ")
    return [c]


def _ref_kv_update(args: list[Any], at: dict[str, Any]) -> Any:  # a KVCacheValue
    cache, k, v, start = args
    if not isinstance(cache, KVCacheValue):
        raise TypeError(f"expected a KVCacheValue, got {type(cache).__name__}")
    s0, n = int(start), k.shape[2]
    if k.dtype != cache.keys.dtype:
        raise TypeError(f"k has dtype {k.dtype} but the cache holds {cache.keys.dtype}")
    if k.shape[0] != cache.batch:
        raise ValueError(f"k has batch {k.shape[0]} but the cache holds {cache.batch}")
    if s0 < 0 or s0 + n > cache.max_len:
        raise ValueError(
            f"writing positions {s0}..{s0 + n} overflows a cache of max_len {cache.max_len}"
        )
    keys, values = cache.keys.copy(), cache.values.copy()
    keys[at["layer"], :, :, s0 : s0 + n] = k
    values[at["layer"], :, :, s0 : s0 + n] = v
    return KVCacheValue(keys, values)


register(
    OpDef(
        name="llm.kv_cache_update",
        summary="Write k and v ([B, Hkv, S, D]) into one layer of the cache at positions "
        "start .. start+S-1; returns the new cache (the old value is unchanged).",
        operands=(
            Operand("cache"),
            Operand("k"),
            Operand("v"),
            Operand("start", doc="i64 scalar: the position of k's first row"),
        ),
        attrs=(Attr("layer", "int", doc="which layer's slot"),),
        infer=_infer_kv_update,
        reference=_ref_kv_update,
        effects=True,
        no_smt="a KV cache is state (a kv_cache value, not a tensor): its reads and writes "
        "are ordered effects",
        verifies="k and v are [B, kv_heads, S, head_dim] of the cache's dtype, start is an integer "
        "scalar, and layer is in range.",
        example="%c1 = llm.kv_cache_update %c0, %k, %v, %start {layer = 0} : "
        "(!llm.kv_cache<layers=2, kv_heads=2, max_len=128, head_dim=16, dtype=f32>, "
        "tensor<?batch x 2 x ?seq x 16 x f32>, tensor<?batch x 2 x ?seq x 16 x f32>, tensor<i64>) "
        "-> !llm.kv_cache<layers=2, kv_heads=2, max_len=128, head_dim=16, dtype=f32>",
    )
)


def _infer_kv_read(ctx: InferCtx) -> list[Type]:
    c = kv_arg(ctx, 0)
    _int_scalar(ctx, 1, "length")
    _check_kv_layer(ctx, c)
    t = TensorType((DYN, c.kv_heads, DYN, c.head_dim), c.dtype)
    return [t, t]


def _ref_kv_read(args: list[Any], at: dict[str, Any]) -> list[np.ndarray]:
    cache, length = args
    if not isinstance(cache, KVCacheValue):
        raise TypeError(f"expected a KVCacheValue, got {type(cache).__name__}")
    n = int(length)
    if not 0 <= n <= cache.max_len:
        raise ValueError(f"reading {n} positions from a cache of max_len {cache.max_len}")
    layer = at["layer"]
    return [cache.keys[layer, :, :, :n].copy(), cache.values[layer, :, :, :n].copy()]


register(
    OpDef(
        name="llm.kv_cache_read",
        summary="The first `length` positions of one layer's keys and values: two [B, Hkv, length, D] "
        "tensors (the text may name the length dim, e.g. ?past+?seq).",
        operands=(Operand("cache"), Operand("length", doc="i64 scalar")),
        attrs=(Attr("layer", "int", doc="which layer's slot"),),
        infer=_infer_kv_read,
        reference=_ref_kv_read,
        results=("k", "v"),
        no_smt="a KV cache is state (a kv_cache value, not a tensor): its reads and writes "
        "are ordered effects",
        verifies="length is an integer scalar and layer is in range; the results are "
        "[?, kv_heads, ?, head_dim] of the cache's dtype.",
        example="%k, %v = llm.kv_cache_read %c, %n {layer = 1} : "
        "(!llm.kv_cache<layers=2, kv_heads=2, max_len=128, head_dim=16, dtype=f32>, tensor<i64>) "
        "-> (tensor<?batch x 2 x ?past+?seq x 16 x f32>, tensor<?batch x 2 x ?past+?seq x 16 x f32>)",
    )
)


# -- quantization ---------------------------------------------------------------------------------


def _nbits_shapes(q: QuantType, shape: tuple[Dim, ...]) -> tuple[tuple[Dim, ...], tuple[Dim, ...]]:
    """(scales shape, zero-points shape) for nbits data of logical `shape`."""
    k = shape[-1]
    nb = dim_div_exact(k, q.block) if not isinstance(k, int) else k // q.block
    zb: Dim = (nb * q.bits + 7) // 8 if isinstance(nb, int) else DYN
    return (*shape[:-1], nb), (*shape[:-1], zb)


def _check_format(q: QuantType, shape: tuple[Dim, ...], quantizing: bool) -> None:
    from llmir_core.quant import gguf_blocks, int32_packed, nbits

    if not shape:
        raise OpVerifyError("quantized tensors need rank >= 1 (blocks run along the last dim)")
    if q.scheme == "nbits":
        if q.bits not in nbits.SUPPORTED_BITS:
            raise OpVerifyError(f"nbits supports bits {nbits.SUPPORTED_BITS}, got {q.bits}")
        if q.zero not in ("none", "int"):
            raise OpVerifyError(f"nbits zero must be none or int, got {q.zero}")
        if not q.scale.is_float:
            raise OpVerifyError(f"nbits scales must be float, got {q.scale}")
        group = q.block
    elif q.scheme in gguf_blocks.BLOCKS:
        if quantizing and q.scheme not in gguf_blocks.QUANTIZABLE:
            raise OpVerifyError(
                f"quantizing to {q.scheme} is not supported "
                f"(supported: {', '.join(gguf_blocks.QUANTIZABLE)}, nbits)"
            )
        group = gguf_blocks.BLOCKS[q.scheme][0]
    elif q.scheme in int32_packed.SCHEMES:
        if quantizing:
            raise OpVerifyError(
                f"{q.scheme} is a checkpoint storage format: llmir imports it but "
                "does not quantize to it (quantize to nbits)"
            )
        if len(shape) != 2:
            raise OpVerifyError(f"{q.scheme} weights are 2-D [out, in], got rank {len(shape)}")
        if q.zero not in ("none", "int") or (q.scheme != "ctpack" and q.zero != "int"):
            raise OpVerifyError(
                f"{q.scheme} zero must be int{' or none' if q.scheme == 'ctpack' else ''}, "
                f"got {q.zero}"
            )
        if not q.scale.is_float:
            raise OpVerifyError(f"{q.scheme} scales must be float, got {q.scale}")
        rows, cols = shape[0], shape[1]
        if isinstance(rows, int) and isinstance(cols, int):
            why = int32_packed.check_layout(q.scheme, q.bits, rows, cols, q.block)
            if why:
                raise OpVerifyError(f"{q.scheme}: {why}")
        return
    else:
        raise OpVerifyError(f"unknown quantization scheme '{q.scheme}'")
    if isinstance(shape[-1], int) and shape[-1] % group:
        raise OpVerifyError(
            f"last dim {shape[-1]} is not a multiple of the {q.scheme} block ({group})"
        )


def _infer_quantize(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    q = ctx["format"]
    _check_format(q, x.shape, quantizing=True)
    out: list[Type] = [TensorType(x.shape, q)]
    if q.scheme == "nbits":
        sc, zp = _nbits_shapes(q, x.shape)
        out.append(TensorType(sc, q.scale))
        if q.zero == "int":
            out.append(TensorType(zp, DType.u8))
    return out


def _ref_quantize(args: list[np.ndarray], at: dict[str, Any]) -> list[Any]:
    from llmir_core.quant import quantize

    packed, scales, zp = quantize(args[0], at["format"])
    return [r for r in (packed, scales, zp) if r is not None]


register(
    OpDef(
        name="llm.quantize",
        summary="Quantize floats to a block format: GGUF q4_0/q4_1/q5_0/q5_1/q8_0 (bit-exact with "
        "gguf's quantizer) give one packed result; nbits (onnxruntime MatMulNBits layout) also "
        "gives its scales and, for zero=int, its packed u8 zero points.",
        operands=(Operand("x"),),
        attrs=(Attr("format", "quant", doc="the target QuantType, e.g. !quant.q4_0"),),
        infer=_infer_quantize,
        reference=_ref_quantize,
        results=("packed", "scales", "zero_points"),
        variadic_results=True,
        smt=encoding("llm_smt", "quantize"),
        verifies="x is a float tensor whose last dim splits into whole blocks of a quantizable format.",
        example="%p = llm.quantize %w {format = !quant.q4_0} : (tensor<128x64xf32>) -> tensor<128x64x!quant.q4_0>",
    )
)


def _infer_packed(ctx: InferCtx, i: int) -> tuple[TensorType, QuantType]:
    w = tensor_arg(ctx, i, "packed")
    if not isinstance(w.dtype, QuantType):
        raise OpVerifyError(f"operand #{i} must be block-quantized (!quant...), got {w}")
    q = w.dtype
    _check_format(q, w.shape, quantizing=False)
    extra = len(ctx.types) - i - 1
    if q.scheme in INT32_PACKED:
        _check_int32_packed(ctx, i, w, q, extra)
        return w, q
    if q.scheme != "nbits":
        if extra:
            raise OpVerifyError(
                f"{q.scheme} blocks carry their own scales: pass no scales/zero points"
            )
        return w, q
    sc_shape, zp_shape = _nbits_shapes(q, w.shape)
    if extra < 1:
        raise OpVerifyError("nbits data needs its scales operand")
    sc = tensor_arg(ctx, i + 1, "scales")
    _need_dtype(sc, q.scale, "scales")
    want = [(sc, sc_shape, "scales")]
    if q.zero == "int":
        if extra < 2:
            raise OpVerifyError("nbits with zero=int needs its zero_points operand")
        zp = tensor_arg(ctx, i + 2, "zero_points")
        _need_dtype(zp, DType.u8, "zero_points")
        want.append((zp, zp_shape, "zero_points"))
    elif extra > 1:
        raise OpVerifyError("nbits with zero=none takes no zero_points")
    for t, shape, what in want:
        if t.rank != len(shape) or not all(_same(a, c) for a, c in zip(t.shape, shape)):
            raise OpVerifyError(
                f"{what} has shape {fmt_shape(t.shape)}, expected {fmt_shape(shape)}"
            )
    return w, q


INT32_PACKED = ("gptq", "gptq_v2", "awq", "ctpack")


def _check_int32_packed(ctx: InferCtx, i: int, w: TensorType, q: QuantType, extra: int) -> None:
    """Operands after the packed weight: scales, zero points (zero=int: int32, packed as the
    checkpoint stores them), then an optional i32 g_idx [K]."""
    from llmir_core.quant import int32_packed

    n, k = w.shape
    names = ["scales"] + (["zero_points"] if q.zero == "int" else [])
    if extra < len(names) or extra > len(names) + 1:
        raise OpVerifyError(
            f"{q.scheme} with zero={q.zero} takes {', '.join(names)} and an optional "
            f"g_idx, got {extra} operand(s) after the weight"
        )
    if not (isinstance(n, int) and isinstance(k, int)):
        return
    want = int32_packed.shapes(q.scheme, q.bits, n, k, q.block)
    sc = tensor_arg(ctx, i + 1, "scales")
    _need_dtype(sc, q.scale, "scales")
    checks = [(sc, want["scales"], "scales")]
    if q.zero == "int":
        zp = tensor_arg(ctx, i + 2, "zero_points")
        _need_dtype(zp, DType.i32, "zero_points")
        checks.append((zp, want["zeros"], "zero_points"))
    if extra > len(names):
        gi = tensor_arg(ctx, i + 1 + len(names), "g_idx")
        _need_dtype(gi, DType.i32, "g_idx")
        checks.append((gi, (k,), "g_idx"))
    for t, shape, what in checks:
        if t.rank != len(shape) or not all(_same(a, c) for a, c in zip(t.shape, shape)):
            raise OpVerifyError(
                f"{what} has shape {fmt_shape(t.shape)}, expected {fmt_shape(shape)}"
            )


def _infer_dequantize(ctx: InferCtx) -> list[Type]:
    w, _ = _infer_packed(ctx, 0)
    dt = ctx["dtype"]
    if not dt.is_float:
        raise OpVerifyError(f"dtype must be a float dtype, got {dt}")
    return [TensorType(w.shape, dt)]


def _dequant(args: list[Any]) -> np.ndarray:
    from llmir_core.quant import dequantize

    q = args[0].qtype
    if q.scheme in INT32_PACKED and q.zero == "none":
        return dequantize(args[0], args[1], None, *args[2:])
    return dequantize(args[0], *args[1:])


register(
    OpDef(
        name="llm.dequantize",
        summary="Decode block-quantized data to floats (GGUF formats bit-exact with gguf's decoder; "
        "nbits as (code - zero) * scale; the int32-packed checkpoint formats gptq, gptq_v2, awq "
        "and ctpack as (code - zero[g]) * scale[g] with g = g_idx[k] or k / block).",
        operands=(
            Operand("packed"),
            Operand("scales", optional=True, doc="nbits and int32-packed only"),
            Operand("zero_points", optional=True, doc="nbits/int32-packed with zero=int only"),
            Operand(
                "g_idx",
                optional=True,
                doc="int32-packed only: i32 [K] group of each input column (GPTQ act-order)",
            ),
        ),
        attrs=(Attr("dtype", "dtype", DType.f32, doc="the result's float dtype"),),
        infer=_infer_dequantize,
        reference=lambda a, at: _dequant(a).astype(numpy_dtype(at["dtype"])),
        smt=encoding("llm_smt", "dequantize"),
        interval=ranges.iv_first,
        verifies="packed has a block-quantized dtype, scales/zero points are present exactly when the "
        "format keeps them outside the blocks and have the per-block shape, and dtype is a float.",
        example="%w = llm.dequantize %p : (tensor<128x64x!quant.q4_0>) -> tensor<128x64xf32>",
    )
)


def _infer_qmatmul(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    w, _ = _infer_packed(ctx, 1)
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1")
    level = ctx.attrs.get("accuracy_level", -1)  # (triton.q_matmul shares this rule)
    if not -1 <= level <= 4:
        raise OpVerifyError(f"accuracy_level must be -1..4, got {level}")
    _need_rank(w, 2, "the packed weight")
    n, k = (w.shape[0], w.shape[1]) if ctx["transpose_b"] else (w.shape[1], w.shape[0])
    _need_dim(k, x.shape[-1], f"contraction dims differ: x has {x.shape[-1]}, the weight {k}")
    return [like(x, (*x.shape[:-1], n))]


def _ref_qmatmul(args: list[Any], at: dict[str, Any]) -> np.ndarray:
    x = args[0]
    w = _f64(_dequant(args[1:]))
    return (_f64(x) @ (w.T if at["transpose_b"] else w)).astype(x.dtype)


def _dec_qmatmul(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    x, dt = _work(b, o[0])
    w = b.op(
        "core.matmul",
        x,
        b.op("llm.dequantize", *o[1:], dtype=x.type.dtype),
        transpose_b=at["transpose_b"],
    )
    return [_back(b, w, dt)]


register(
    OpDef(
        name="llm.quantized_matmul",
        summary="x @ dequantize(w)^T (transpose_b, HF [out, in] layout with blocks along in) or "
        "x @ dequantize(w); the result has x's dtype.",
        operands=(
            Operand("x"),
            Operand("w_packed"),
            Operand("scales", optional=True, doc="nbits only"),
            Operand("zero_points", optional=True, doc="nbits with zero=int only"),
        ),
        attrs=(
            Attr("transpose_b", "bool", True, doc="w is [N, K] (true) or [K, N] (false)"),
            Attr(
                "accuracy_level",
                "int",
                -1,
                doc="the activation precision a runtime may use (ONNX MatMulNBits' 0-4, kept "
                "from an imported node); -1: the build's choice",
            ),
        ),
        infer=_infer_qmatmul,
        reference=_ref_qmatmul,
        decompose=_dec_qmatmul,
        smt=encoding("llm_smt", "quantized_matmul"),
        interval=ranges.iv_matmul,
        cost=ranges.cost_matmul,
        verifies="x is a float tensor, w a 2-D block-quantized weight (with scales/zero points as its "
        "format needs) whose K matches x's last dim; accuracy_level is -1..4.",
        example="%y = llm.quantized_matmul %x, %w, %s : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<128x64x!quant<nbits, bits=4, block=32, scale=f32, zero=none>>, tensor<128x2xf32>) "
        "-> tensor<?batch x ?seq x 128 x f32>",
    )
)


# -- fused ops (targets of the -O3 fusion passes) -------------------------------------------------


def _infer_add_rms_norm(ctx: InferCtx) -> list[Type]:  # operand kinds, dtypes, ranks: declared
    x, r, w = (tensor_arg(ctx, i) for i in range(3))
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1 (the normalized dim is the last)")
    if r.rank != x.rank or not all(_same(a, c) for a, c in zip(x.shape, r.shape)):
        raise OpVerifyError(
            f"residual {fmt_shape(r.shape)} must have x's shape {fmt_shape(x.shape)}"
        )
    _need_dim(
        w.shape[0],
        x.shape[-1],
        f"weight has {w.shape[0]} elements but x's last dim is {x.shape[-1]}",
    )
    if ctx["eps"] < 0:
        raise OpVerifyError(f"eps must be >= 0, got {ctx['eps']}")
    return [x, x]


def _ref_add_rms_norm(args: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    x, r, w = args
    s = (_f64(x) + _f64(r)).astype(x.dtype)  # the sum is a result: rounded like core.add
    return [_ref_rms_norm([s, w], at), s]


def _dec_add_rms_norm(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    s = b.op("core.add", o[0], o[1])
    return [_dec_rms_norm(b, [s, o[2]], at)[0], s]


register(
    OpDef(
        name="llm.add_rms_norm",
        summary="Residual add fused with RMS normalization: sum = x + residual; "
        "normed = sum / sqrt(mean(sum^2) + eps) * (weight + offset). Returns (normed, sum).",
        operands=(
            Operand("x", kind="float"),
            Operand("residual", doc="x's shape and dtype", kind="tensor", dtype_of="x"),
            Operand("weight", doc="[hidden]", kind="tensor", rank=1, dtype_of="x"),
        ),
        attrs=(
            Attr("eps", "float", 1e-6, doc="added to the mean square"),
            Attr(
                "offset", "float", 0.0, doc="added to weight (gemma stores weight - 1: offset 1.0)"
            ),
        ),
        infer=_infer_add_rms_norm,
        reference=_ref_add_rms_norm,
        decompose=_dec_add_rms_norm,
        smt=encoding("llm_smt", "add_rms_norm"),
        interval=ranges.iv_add_norm,
        cost=ranges.cost_add_norm,
        results=("normed", "sum"),
        verifies="x and residual share one float dtype and shape, weight is 1-D over the last dim, "
        "and eps >= 0.",
        example="%y, %s = llm.add_rms_norm %x, %r, %w {eps = 1e-05} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<?batch x ?seq x 64 x f32>, tensor<64xf32>) -> (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<?batch x ?seq x 64 x f32>)",
    )
)

_LINEAR_ACTIVATIONS = ("none", "silu", "gelu", "gelu_tanh", "relu")


def _infer_linear(ctx: InferCtx) -> list[Type]:
    x, w = float_tensor(ctx, 0, "x"), tensor_arg(ctx, 1, "w")
    if x.rank == 0:
        raise OpVerifyError("x must have rank >= 1")
    _need_rank(w, 2, "w")
    _need_dtype(w, x.dtype, "w")
    n, k = (w.shape[0], w.shape[1]) if ctx["transpose_b"] else (w.shape[1], w.shape[0])
    _need_dim(k, x.shape[-1], f"contraction dims differ: x has {x.shape[-1]}, w {k}")
    if len(ctx.types) > 2:
        bias = tensor_arg(ctx, 2, "bias")
        _need_rank(bias, 1, "bias")
        _need_dtype(bias, x.dtype, "bias")
        _need_dim(bias.shape[0], n, f"bias has {bias.shape[0]} elements but the output has {n}")
    return [like(x, (*x.shape[:-1], n))]


def _linear_act64(name: str, y: np.ndarray) -> np.ndarray:
    if name == "none":
        return y
    if name == "relu":
        return np.maximum(y, 0.0)
    return _act64(name, y)


def _ref_linear(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, w = _f64(args[0]), _f64(args[1])
    y = x @ (w.T if at["transpose_b"] else w)
    if len(args) > 2:
        y = y + _f64(args[2])
    with np.errstate(over="ignore"):
        return _linear_act64(at["activation"], y).astype(args[0].dtype)


def _dec_linear(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    y = b.op("core.matmul", o[0], o[1], transpose_b=at["transpose_b"])
    if len(o) > 2:
        y = b.op("core.add", y, o[2])
    act = at["activation"]
    if act in ("silu", "relu"):
        y = b.op(f"core.{act}", y)
    elif act in ("gelu", "gelu_tanh"):
        y = b.op("core.gelu", y, approximate="none" if act == "gelu" else "tanh")
    return [y]


def _iv_linear(op: Any, ins: list[ranges.Iv], env: dict[str, int], max_dim: int) -> ranges.Iv:
    k = ranges.dim(op.operands[0].type, -1, env, max_dim)
    m = k * ranges.absmax(ins[0]) * ranges.absmax(ins[1])
    bias = ins[2] if len(ins) > 2 else (0.0, 0.0)
    return ranges.activation(str(op.attrs.get("activation", "none")), (-m + bias[0], m + bias[1]))


def _cost_linear(op: Any, env: dict[str, int]) -> tuple[int, int]:
    """2 * K FLOPs per output element plus the bias and activation; every operand read once."""
    out = ranges.numel(op.results[0].type, env)
    k = ranges.dim(op.operands[0].type, -1, env, 1)
    return 2 * out * k + 2 * out, sum(4 * ranges.numel(v.type, env) for v in op.operands)


register(
    OpDef(
        name="llm.linear",
        summary="A projection with optional bias and activation: act(x @ w^T + bias) (transpose_b, "
        "HF [out, in] weights) or act(x @ w + bias); activation none, silu, gelu (erf), "
        "gelu_tanh or relu.",
        operands=(
            Operand("x"),
            Operand("w", doc="[out, in] (transpose_b) or [in, out]"),
            Operand("bias", optional=True, doc="[out]"),
        ),
        attrs=(
            Attr(
                "activation",
                "str",
                "none",
                choices=_LINEAR_ACTIVATIONS,
                doc="applied after the bias",
            ),
            Attr("transpose_b", "bool", True, doc="w is [out, in] (true) or [in, out] (false)"),
        ),
        infer=_infer_linear,
        reference=_ref_linear,
        decompose=_dec_linear,
        smt=encoding("llm_smt", "linear"),
        interval=_iv_linear,
        cost=_cost_linear,
        verifies="x is a float tensor, w a 2-D matrix of x's dtype whose contraction dim matches x's "
        "last dim, and bias (if any) is 1-D over the output dim.",
        example='%y = llm.linear %x, %w, %b {activation = "gelu_tanh"} : (tensor<?batch x ?seq x 64 x f32>, '
        "tensor<256x64xf32>, tensor<256xf32>) -> tensor<?batch x ?seq x 256 x f32>",
    )
)


# -- placement (assign-precision) -----------------------------------------------------------------


def _infer_to_device(ctx: InferCtx) -> list[Type]:
    x = tensor_arg(ctx, 0, "x")
    for key in ("device", "layout"):
        v = ctx[key]
        if not isinstance(v, str) or any(c in v for c in '"\\'):
            raise OpVerifyError(f"{key} must be a plain string, got {v!r}")
    return [TensorType(x.shape, x.dtype, ctx["layout"] or None, ctx["device"] or None, x.sema)]


register(
    OpDef(
        name="llm.to_device",
        summary="Place x on a device with a physical layout: the same values, with the result type's "
        '`device` and `layout` options set ("" clears one: host memory, row-major). A backend '
        "copies and reorders; the reference interpreter returns x.",
        operands=(Operand("x"),),
        attrs=(
            Attr("device", "str", "", doc='e.g. "cuda", "cpu"; "" = host (no annotation)'),
            Attr("layout", "str", "", doc='e.g. "nk" (a [out, in] matrix), "kn"; "" = row-major'),
        ),
        infer=_infer_to_device,
        reference=lambda a, at: np.array(a[0], copy=True),
        smt=lambda enc, args, at: args[0],  # the same values, placed elsewhere
        interval=lambda op, ins, env, max_dim: ins[0],
        verifies="x is a tensor and device and layout are plain strings.",
        example='%y = llm.to_device %x {device = "cuda"} : (tensor<?batch x ?seq x 64 x f16>) '
        '-> tensor<?batch x ?seq x 64 x f16, device="cuda">',
    )
)

__all__ = ["KVCacheValue"]
