"""`llm.moe`: a mixture-of-experts feed-forward block (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek).

The router scores every expert (`softmax` over the experts, or an independent `sigmoid` each),
keeps the `top_k` best per token (ties: the lower expert index), optionally renormalises the kept
scores to sum to 1 (`norm_topk`), scales them by `routed_scale`, and sums the chosen experts'
gated MLPs weighted by them. DeepSeek-V2's group-limited routing (`n_group` > 1): the experts
form `n_group` consecutive groups, each scored by its best expert; only the experts of the
`topk_group` best groups can be chosen (the others' scores count as 0). Optional shared experts (one gated MLP of any width, run on every
token, DeepSeek / Qwen2-MoE) are added, each token's share multiplied by
sigmoid(x @ shared_router^T) when `shared_router` is given (Qwen2-MoE's shared_expert_gate).

The decomposition is dense (every expert runs on every token and the unchosen ones get weight 0):
exact, and made only of ops the onnxruntime build already lowers; a backend with a sparse MoE
kernel lowers `llm.moe` directly instead (onnxruntime: passes/lower_ort_moe.py to
`ort.moe`/`ort.qmoe`, whose decompositions reuse the pieces here).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.ir.types import Type

from .llm import _ACTIVATIONS, _act64, _f64
from .opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError
from .registry import register
from .shapes import float_tensor, like, tensor_arg

_SCORING = ("softmax", "sigmoid")


def _same(a: Any, b: Any, msg: str) -> None:
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise OpVerifyError(msg)


def _infer_moe(ctx: InferCtx) -> list[Type]:
    x = float_tensor(ctx, 0, "x")
    if x.rank < 2:
        raise OpVerifyError(f"x must have rank >= 2 ([..., tokens, hidden]), got rank {x.rank}")
    hidden = x.shape[-1]
    router = tensor_arg(ctx, 1, "router")
    if router.rank != 2:
        raise OpVerifyError(f"router must be [experts, hidden], got rank {router.rank}")
    experts = router.shape[0]
    _same(router.shape[1], hidden, f"router takes {router.shape[1]} inputs but x has {hidden}")
    wg, wu, wd = (tensor_arg(ctx, i, n) for i, n in ((2, "w_gate"), (3, "w_up"), (4, "w_down")))
    for t, n in ((wg, "w_gate"), (wu, "w_up"), (wd, "w_down")):
        if t.rank != 3:
            raise OpVerifyError(f"{n} must be [experts, out, in], got rank {t.rank}")
        _same(t.shape[0], experts, f"{n} has {t.shape[0]} experts but the router scores {experts}")
        if t.dtype != x.dtype:
            raise OpVerifyError(f"{n} must have x's dtype {x.dtype}, got {t.dtype}")
    _same(wg.shape[2], hidden, f"w_gate takes {wg.shape[2]} inputs but x has {hidden}")
    _same(wu.shape[1], wg.shape[1], f"w_up has {wu.shape[1]} outputs but w_gate has {wg.shape[1]}")
    _same(
        wd.shape[2],
        wg.shape[1],
        f"w_down takes {wd.shape[2]} inputs but the experts give {wg.shape[1]}",
    )
    _same(wd.shape[1], hidden, f"w_down gives {wd.shape[1]} outputs but x has {hidden}")
    k = ctx.attrs["top_k"]
    if k < 1 or (isinstance(experts, int) and k > experts):
        raise OpVerifyError(f"top_k must be in 1..{experts}, got {k}")
    n_operands = len(ctx.types)
    if n_operands not in (5, 8, 9):
        raise OpVerifyError(
            f"takes 5 operands, or 8 with a shared expert (gate, up, down), or 9 with its "
            f"router; got {n_operands}"
        )
    if n_operands >= 8:
        sg, su, sd = (
            tensor_arg(ctx, i, m)
            for i, m in ((5, "shared_gate"), (6, "shared_up"), (7, "shared_down"))
        )
        for t, m in ((sg, "shared_gate"), (su, "shared_up"), (sd, "shared_down")):
            if t.rank != 2:
                raise OpVerifyError(f"{m} must be [out, in], got rank {t.rank}")
        _same(sg.shape[1], hidden, f"shared_gate takes {sg.shape[1]} inputs but x has {hidden}")
        _same(sd.shape[0], hidden, f"shared_down gives {sd.shape[0]} outputs but x has {hidden}")
    if n_operands == 9:
        sr = tensor_arg(ctx, 8, "shared_router")
        if sr.rank != 2 or not (sr.shape[0] == 1):
            raise OpVerifyError(f"shared_router must be [1, hidden], got {sr}")
    if ctx.attrs["routed_scale"] <= 0:
        raise OpVerifyError(f"routed_scale must be > 0, got {ctx.attrs['routed_scale']}")
    _check_groups(ctx.attrs, experts, k)
    return [like(x)]


def _check_groups(at: dict[str, Any], experts: Any, k: int) -> None:
    g, tg = at["n_group"], at["topk_group"]
    if g < 1 or not 1 <= tg <= g:
        raise OpVerifyError(f"need n_group >= 1 and 1 <= topk_group <= n_group, got {g}, {tg}")
    if g > 1 and isinstance(experts, int):
        if experts % g:
            raise OpVerifyError(f"n_group ({g}) must divide the {experts} experts")
        if k > tg * (experts // g):
            raise OpVerifyError(
                f"top_k ({k}) exceeds the {tg * (experts // g)} experts of the topk_group "
                f"({tg}) groups"
            )


def group_limit(scores: np.ndarray, n_group: int, topk_group: int) -> np.ndarray:
    """scores with the experts outside the topk_group best groups (by their best expert) set
    to 0 (ties: the lower group index)."""
    if n_group <= 1:
        return scores
    grouped = scores.reshape(*scores.shape[:-1], n_group, -1)
    best = np.argsort(-grouped.max(-1), axis=-1, kind="stable")[..., :topk_group]
    keep = np.zeros(grouped.shape[:-1], bool)
    np.put_along_axis(keep, best, True, -1)
    return np.where(keep[..., None], grouped, 0.0).reshape(scores.shape)


def routing(x: np.ndarray, router: np.ndarray, at: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(expert indices [..., k], weights [..., k]) per token, in float64."""
    logits = x @ router.T
    if at["scoring"] == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        scores = e / e.sum(-1, keepdims=True)
    else:
        scores = 1.0 / (1.0 + np.exp(-logits))
    scores = group_limit(scores, at.get("n_group", 1), at.get("topk_group", 1))
    k = at["top_k"]
    # descending, ties to the lower index (stable sort of the negated scores)
    idx = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    w = np.take_along_axis(scores, idx, -1)
    if at["norm_topk"]:
        w = w / w.sum(-1, keepdims=True)
    return idx, w * at["routed_scale"]


def _ref_moe(args: list[np.ndarray], at: dict[str, Any]) -> np.ndarray:
    x, router, wg, wu, wd = (_f64(a) for a in args[:5])
    idx, w = routing(x, router, at)
    flat_x, flat_i, flat_w = (
        x.reshape(-1, x.shape[-1]),
        idx.reshape(-1, idx.shape[-1]),
        w.reshape(-1, w.shape[-1]),
    )
    out = np.zeros_like(flat_x)
    act = at["activation"]
    for t in range(flat_x.shape[0]):
        for e, weight in zip(flat_i[t], flat_w[t]):
            h = _act64(act, wg[e] @ flat_x[t]) * (wu[e] @ flat_x[t])
            out[t] += weight * (wd[e] @ h)
    out = out.reshape(x.shape)
    if len(args) >= 8:
        sg, su, sd = (_f64(a) for a in args[5:8])
        shared = (_act64(act, x @ sg.T) * (x @ su.T)) @ sd.T
        if len(args) == 9:
            shared = shared / (1.0 + np.exp(-(x @ _f64(args[8]).T)))
        out = out + shared
    return out.astype(args[0].dtype)


def dec_group_limit(b: Any, scores: Any, n_group: int, topk_group: int) -> Any:
    """`group_limit` in core ops: scores [..., E] with the unchosen groups' experts at 0."""
    if n_group <= 1:
        return scores
    r = scores.type.rank
    keep_dims = (0,) * (r - 1)
    experts = scores.type.shape[-1]
    grouped = b.op("core.reshape", scores, shape=(*keep_dims, n_group, experts // n_group))
    best = b.op("core.reduce_max", grouped, axes=(-1,), keepdims=False)  # [..., G]
    top = b.create(
        "core.top_k", [best], {"k": topk_group, "axis": -1, "largest": True, "sorted": True}
    )
    zeros = b.op("core.mul", best, _const(b, 0.0, scores))
    ones = b.op(
        "core.add", b.op("core.mul", top.results[0], _const(b, 0.0, scores)), _const(b, 1.0, scores)
    )  # [..., topk_group] of 1
    mask = b.op("core.scatter_elements", zeros, top.results[1], ones, axis=-1)
    kept = b.op("core.mul", grouped, b.op("core.unsqueeze", mask, axes=(r,)))
    return b.op("core.reshape", kept, shape=(*keep_dims, experts))


def dec_dense_weights(
    b: Any, select: Any, k: int, norm: bool, scale: float, weights: Any | None = None
) -> Any:
    """[..., E] mixing weights, 0 for the experts not among the top k of `select`: the kept
    values of `select` (or of `weights` at those experts), renormalised and scaled."""
    top = b.create("core.top_k", [select], {"k": k, "axis": -1, "largest": True, "sorted": True})
    vals, idx = top.results
    if weights is not None:
        vals = b.op("core.gather_elements", weights, idx, axis=-1)
    if norm:
        vals = b.op("core.div", vals, b.op("core.reduce_sum", vals, axes=(-1,), keepdims=True))
    if scale != 1.0:
        vals = b.op("core.mul", vals, _const(b, scale, select))
    zeros = b.op("core.mul", select, _const(b, 0.0, select))
    return b.op("core.scatter_elements", zeros, idx, vals, axis=-1)  # 0 for the unchosen


def _act(b: Any, v: Any, act: str) -> Any:
    if act == "silu":
        return b.op("core.silu", v)
    return b.op("core.gelu", v, approximate="none" if act == "gelu" else "tanh")


def dec_experts(b: Any, x: Any, dense: Any, wg: Any, wu: Any, wd: Any, act: str) -> Any:
    """sum over experts e of dense[..., e] * expert e's gated MLP of x, every expert on every
    token (x [..., T, H], dense [..., T, E])."""
    r = x.type.rank
    xe = b.op("core.unsqueeze", x, axes=(r - 2,))  # [..., 1, T, H]
    gate = _act(b, b.op("core.matmul", xe, wg, transpose_b=True), act)  # [..., E, T, I]
    h = b.op("core.mul", gate, b.op("core.matmul", xe, wu, transpose_b=True))
    y = b.op("core.matmul", h, wd, transpose_b=True)  # [..., E, T, H]
    perm = tuple(range(r - 2)) + (r - 1, r - 2)
    we = b.op(
        "core.unsqueeze", b.op("core.transpose", dense, perm=perm), axes=(r,)
    )  # [..., E, T, 1]
    return b.op("core.reduce_sum", b.op("core.mul", y, we), axes=(r - 2,), keepdims=False)


def dec_shared(b: Any, x: Any, shared: list[Any], act: str) -> Any:
    """The shared expert's gated MLP of x, times sigmoid(x @ shared_router^T) when given."""
    sg, su, sd = shared[:3]
    h = b.op(
        "core.mul",
        _act(b, b.op("core.matmul", x, sg, transpose_b=True), act),
        b.op("core.matmul", x, su, transpose_b=True),
    )
    out = b.op("core.matmul", h, sd, transpose_b=True)
    if len(shared) == 4:
        gate = b.op("core.sigmoid", b.op("core.matmul", x, shared[3], transpose_b=True))
        out = b.op("core.mul", out, gate)
    return out


def dec_scores(b: Any, logits: Any, scoring: str) -> Any:
    if scoring == "softmax":
        return b.op("core.softmax", logits, axis=-1)
    return b.op("core.sigmoid", logits)


def _dec_moe(b: Any, o: list[Any], at: dict[str, Any]) -> list[Any]:
    x, router, wg, wu, wd = o[:5]
    logits = b.op("core.matmul", x, router, transpose_b=True)  # [..., T, E]
    scores = dec_group_limit(
        b, dec_scores(b, logits, at["scoring"]), at["n_group"], at["topk_group"]
    )
    dense = dec_dense_weights(b, scores, at["top_k"], at["norm_topk"], at["routed_scale"])
    out = dec_experts(b, x, dense, wg, wu, wd, at["activation"])
    if len(o) >= 8:
        out = b.op("core.add", out, dec_shared(b, x, list(o[5:]), at["activation"]))
    return [out]


def _const(b: Any, value: float, like_v: Any) -> Any:
    from llmir_core.ir.attrs import DenseAttr
    from llmir_core.ir.types import TensorType

    dt = like_v.type.dtype
    return b.op(
        "core.constant", value=DenseAttr(np.array(value, dtype=dt.to_numpy()), TensorType((), dt))
    )


register(
    OpDef(
        name="llm.moe",
        summary="Mixture of experts: route each token to its top_k experts by softmax or sigmoid "
        "scores of x @ router^T (ties: the lower index; with n_group > 1 only among the experts "
        "of the topk_group groups whose best score is highest), optionally renormalise the kept scores "
        "(norm_topk), scale them by routed_scale, and sum the chosen experts' gated MLPs "
        "(act(x @ w_gate[e]^T) * (x @ w_up[e]^T)) @ w_down[e]^T weighted by them; plus an optional "
        "shared gated MLP, times sigmoid(x @ shared_router^T) when shared_router is given.",
        operands=(
            Operand("x", doc="[..., tokens, hidden]"),
            Operand("router", doc="[experts, hidden]"),
            Operand("w_gate", doc="[experts, inter, hidden]"),
            Operand("w_up", doc="[experts, inter, hidden]"),
            Operand("w_down", doc="[experts, hidden, inter]"),
            Operand("shared_gate", optional=True, doc="[shared_inter, hidden]"),
            Operand("shared_up", optional=True, doc="[shared_inter, hidden]"),
            Operand("shared_down", optional=True, doc="[hidden, shared_inter]"),
            Operand(
                "shared_router", optional=True, doc="[1, hidden]: sigmoid gate of the shared expert"
            ),
        ),
        attrs=(
            Attr("top_k", "int", doc="experts per token"),
            Attr(
                "scoring",
                "str",
                "softmax",
                choices=_SCORING,
                doc="softmax over experts, or sigmoid each",
            ),
            Attr("norm_topk", "bool", True, doc="renormalise the kept scores to sum to 1"),
            Attr("routed_scale", "float", 1.0, doc="multiplies the routed experts' weights"),
            Attr(
                "activation",
                "str",
                "silu",
                choices=_ACTIVATIONS,
                doc="the experts' gate activation",
            ),
            Attr("n_group", "int", 1, doc="expert groups for group-limited routing (1: none)"),
            Attr("topk_group", "int", 1, doc="groups whose experts may be chosen (n_group > 1)"),
        ),
        infer=_infer_moe,
        reference=_ref_moe,
        decompose=_dec_moe,
        no_smt="each token's experts are chosen by a top-k of router scores (a data-dependent "
        "choice); translation validation expands it through its decomposition",
        verifies="x has rank >= 2; router is [E, hidden]; the expert weights are [E, out, in] of x's "
        "dtype chaining hidden -> inter -> hidden; 1 <= top_k <= E; the shared expert, when "
        "present, chains hidden -> shared_inter -> hidden; routed_scale > 0; n_group divides E, "
        "1 <= topk_group <= n_group and top_k fits in the topk_group groups.",
        example="%y = llm.moe %x, %router, %wg, %wu, %wd {top_k = 2} : (tensor<?batch x ?seq x 64 x f32>, "
        "tensor<8x64xf32>, tensor<8x128x64xf32>, tensor<8x128x64xf32>, tensor<8x64x128xf32>) "
        "-> tensor<?batch x ?seq x 64 x f32>",
    )
)

__all__ = [
    "routing",
    "group_limit",
    "dec_group_limit",
    "dec_dense_weights",
    "dec_experts",
    "dec_shared",
    "dec_scores",
]
