"""lower-ort-moe: `llm.moe` becomes onnxruntime's sparse MoE kernels where they fit.

Rewrites each f32 `llm.moe` of a decoder whose expert weights are stored tensors (a stacked
GGUF `ffn_*_exps`, or per-expert weights stacked by `core.concat`) and whose experts are SiLU
gated MLPs into the router matmul plus:

- `ort.qmoe` when the experts are stored in blocks (GGUF q4_0/q8_0/q5_0/q6_k/q3_k repacked
  losslessly; q4_1/q5_1/q2_k/q4_k/q5_k requantized with zero points; nbits passed through) or
  `quant` is int4/int8 (f32 experts quantized). onnxruntime's CPU QMoE takes one width and one
  block size for all three weights: narrower or coarser blocks are widened exactly (4-bit codes
  as 8-bit, a block of 32 as two of 16). Sigmoid scoring and group-limited routing choose by
  the (group-limited) scores and weight by `router_weights`;
- `ort.moe` for f32 experts with softmax scoring and no group limit.

`routed_scale` multiplies the result, and a shared expert is added as its own gated MLP (both
exact: the routed sum is linear in its weights). Everything else keeps `llm.moe` (its dense
decomposition in the build) and the report says why: another activation (CPU MoE runs SwiGLU
only), f32 experts with sigmoid scoring or a group limit (MoE has no router_weights), block
sizes that do not divide hidden and inter, 8-bit experts when `accuracy_level` < 4 asks for
f32 activations (8-bit QMoE always quantizes them to int8: measured), experts not read from
stored tensors. Quantized experts that do not fit become one matmul per expert weight instead
(exact, every expert on every token; lower-ort-matmul makes them MatMulNBits).

Invariant: the replacement computes the same function; when no weight is requantized each new
op's decomposition is exactly the core ops of `llm.moe`'s decomposition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmir_core.dialects.llm_moe import dec_group_limit, dec_scores, dec_shared
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, QuantType, TensorType
from llmir_core.passes.base import PassContext, erase_dead, scratch_builder, take_over
from llmir_core.targets.onnxruntime.lower_common import (
    ACCURACY_LEVEL,
    Evaluate,
    Graph,
    NbitsFormat,
    WSrc,
    check_accuracy_level,
    declare_ort,
    is_decoder,
    nbits_format,
    parse_quant,
    quantize_mode,
    static_evaluator,
    tt,
    weight_src,
)

_FLOAT_KINDS = ("f32", "cast", "eval")


def _slice_weight(op: Op, e: int, experts: int) -> Op:
    """A detached `core.weight` for expert e of a stacked [experts, rows, cols] weight: the same
    file, the expert's bytes (never added to a function; only read)."""
    t = tt(op.results[0])
    nbytes = int(op.attrs["nbytes"]) // experts
    attrs = {k: v for k, v in op.attrs.items() if k != "sha256"}
    attrs.update(
        name=f"{op.attrs.get('name', op.results[0].name)}[{e}]",
        offset=int(op.attrs.get("offset", 0)) + e * nbytes,
        nbytes=nbytes,
    )
    return Op("core.weight", [], [TensorType(t.shape[1:], t.dtype)], attrs, [f"expert{e}"])


def _stacked(g: Graph, v: Value, experts: int, rows: int, cols: int) -> list[WSrc] | None:
    """Per-expert sources of a stacked stored weight: core.weight (f32), core.cast of one, or
    llm.dequantize of a GGUF-quantized one."""
    op = v.owner
    if op is None:
        return None
    kind = {"core.weight": "f32", "core.cast": "cast", "llm.dequantize": "gguf"}.get(op.name)
    if kind is None:
        return None
    w = op if kind == "f32" else op.operands[0].owner
    if w is None or w.name != "core.weight" or "nbytes" not in w.attrs:
        return None
    q = tt(w.results[0]).dtype
    if kind == "f32" and q != DType.f32:
        return None
    if kind == "gguf":
        if len(op.operands) != 1 or not isinstance(q, QuantType):
            return None
        from llmir_core.quant.gguf_repack import LOSSLESS, REQUANT

        if q.scheme not in LOSSLESS and q.scheme not in REQUANT:
            return None
    out = []
    for e in range(experts):
        part = _slice_weight(w, e, experts)
        out.append(WSrc(part.results[0], kind, part, rows, cols))
    return out


def expert_srcs(g: Graph, v: Value) -> list[WSrc] | None:
    """How to read each expert's [rows, cols] slice of a static [experts, rows, cols] weight,
    or None when it is not read from stored tensors."""
    shape = tt(v).static_shape()
    if id(v) not in g.static or shape is None or len(shape) != 3 or tt(v).dtype != DType.f32:
        return None
    experts, rows, cols = shape
    op = v.owner
    parts: list[Value] = []
    if op is not None and op.name == "core.concat" and op.attrs.get("axis") == 0:
        parts = list(op.operands)
    elif op is not None and op.name == "core.unsqueeze":
        parts = [v]
    if parts:
        srcs = []
        for p in parts:
            u = p.owner
            if u is None or u.name != "core.unsqueeze" or tuple(u.attrs.get("axes", ())) != (0,):
                return None
            s = weight_src(g, u.operands[0])
            if s is None or s.kind == "eval":
                return None
            srcs.append(s)
        return srcs if len(srcs) == experts else None
    return _stacked(g, v, experts, rows, cols)


@dataclass(frozen=True)
class _Plan:
    """The QMoE storage of one op: a common width and block, and each weight's packing."""

    bits: int
    block: int
    quantize: tuple[str, str, str]
    detail: str


def _native(srcs: list[WSrc], quant: NbitsFormat | None, ev: Evaluate) -> NbitsFormat | None:
    fmts = {nbits_format(s, quant, ev) for s in srcs}
    return fmts.pop() if len(fmts) == 1 else None


def plan_qmoe(
    weights: list[list[WSrc]],
    quant: NbitsFormat | None,
    hidden: int,
    inter: int,
    ev: Evaluate,
    accuracy_level: int = ACCURACY_LEVEL,
) -> _Plan | str:
    """The QMoE storage of (gate, up, down), or why there is none. Float weights take `quant`
    (or, beside blocked ones, the common format, symmetric)."""
    floats = [all(s.kind in _FLOAT_KINDS for s in srcs) for srcs in weights]
    natives: list[NbitsFormat | None] = []
    for srcs, is_float in zip(weights, floats):
        n = quant if is_float else _native(srcs, None, ev)
        if n is None and not is_float:
            return "the experts of one weight are stored in different formats"
        natives.append(n)
    known = [n for n in natives if n is not None]
    if not known:
        return "no block format for f32 experts (build with --quant int4/int8 to quantize them)"
    bits = max(f.bits for f in known)
    block = min(f.block for f in known)
    if hidden % block or inter % block:
        return f"block size {block} does not divide hidden ({hidden}) and inter ({inter})"
    modes: list[str] = []
    for srcs, n in zip(weights, natives):
        f = n or NbitsFormat(bits, block, False)
        mode = quantize_mode(srcs[0], f, ev)
        if mode == "none" and f.block % block:
            mode = "asym" if f.asym else "sym"
        modes.append(mode)
    kinds = sorted({s.scheme or s.kind for srcs in weights for s in srcs})
    if bits == 8 and accuracy_level < 4:
        return (
            f"8-bit QMoE quantizes activations to int8 at every accuracy level, and "
            f"accuracy_level {accuracy_level} asks for f32 ones (4 allows QMoE)"
        )
    detail = f"{'/'.join(kinds)} experts as int{bits} blocks of {block}, quantize {modes}"
    return _Plan(bits, block, (modes[0], modes[1], modes[2]), detail)


def _expert_weight(b: Any, s: WSrc, detached: bool) -> Value:
    """Expert s's [rows, cols] f32 weight as ops of the function: a per-expert HF weight as it
    is, or the stacked GGUF tensor's slice as its own core.weight (+ llm.dequantize / cast)."""
    if not detached:  # a weight value of the function already
        return s.value
    assert s.op is not None
    w = b.create("core.weight", [], dict(s.op.attrs), result_types=[tt(s.value)]).result
    if s.kind == "gguf":
        return b.op("llm.dequantize", w, dtype=DType.f32)
    return w if s.kind == "f32" else b.op("core.cast", w, to=DType.f32)


def per_expert(fn: Function, op: Op, srcs: list[list[WSrc]]) -> None:
    """Replace `llm.moe` by its dense computation with one matmul per expert weight (by 2-D
    stored weights, which lower-ort-matmul makes MatMulNBits): exact, every expert on every
    token, the experts' weights kept in their blocks."""
    from llmir_core.dialects.llm_moe import _act, dec_dense_weights

    at = op.attrs
    b, new_ops = scratch_builder(fn, op.origin)
    x = op.operands[0]
    logits = b.op("core.matmul", x, op.operands[1], transpose_b=True)
    scores = dec_group_limit(
        b,
        dec_scores(b, logits, at.get("scoring", "softmax")),
        int(at.get("n_group", 1)),
        int(at.get("topk_group", 1)),
    )
    dense = dec_dense_weights(
        b,
        scores,
        int(at["top_k"]),
        bool(at.get("norm_topk", True)),
        float(at.get("routed_scale", 1.0)),
    )
    act = str(at.get("activation", "silu"))
    out: Value | None = None
    in_fn = {id(o) for o in fn.ops}
    for e, (sg, su, sd) in enumerate(zip(*srcs)):
        wg, wu, wd = (_expert_weight(b, s, id(s.op) not in in_fn) for s in (sg, su, sd))
        h = b.op(
            "core.mul",
            _act(b, b.op("core.matmul", x, wg, transpose_b=True), act),
            b.op("core.matmul", x, wu, transpose_b=True),
        )
        share = b.op("core.slice", dense, starts=(e,), ends=(e + 1,), axes=(-1,))
        y = b.op("core.mul", b.op("core.matmul", h, wd, transpose_b=True), share)
        out = y if out is None else b.op("core.add", out, y)
    assert out is not None
    if len(op.operands) >= 8:
        out = b.op("core.add", out, dec_shared(b, x, list(op.operands[5:]), act))
    pos = next(i for i, o in enumerate(fn.ops) if o is op)
    fn.ops[pos:pos] = new_ops
    take_over(fn, op.results[0], out)
    erase_dead(fn, [op])


@dataclass(frozen=True)
class LowerOrtMoe:
    name: ClassVar[str] = "lower-ort-moe"
    summary: ClassVar[str] = (
        "llm.moe -> ort.moe / ort.qmoe (com.microsoft MoE / QMoE) where the CPU kernels fit"
    )
    quant: str = ""
    quant_block: int = 32
    accuracy_level: int = ACCURACY_LEVEL

    def run(self, module: Module, ctx: PassContext) -> bool:
        if not is_decoder(module):  # other modules keep the generic op-by-op build
            return False
        fmt = parse_quant(self.quant, self.quant_block)
        check_accuracy_level(self.accuracy_level)
        ev = static_evaluator(module)
        changed = False
        for fn in module.functions:
            for op in [o for o in fn.ops if o.name == "llm.moe"]:
                g = Graph(fn)
                reason = self._lower(fn, g, op, fmt, ev, ctx)
                if reason is None:
                    changed = True
                    continue
                srcs = [expert_srcs(g, w) for w in op.operands[2:5]]
                stored = [w for w in srcs if w is not None]
                if len(stored) == 3 and any(s.kind not in _FLOAT_KINDS for w in stored for s in w):
                    per_expert(fn, op, stored)
                    ctx.rejected(self.name, op.results[0], reason + "; per-expert matmuls instead")
                    changed = True
                else:
                    ctx.rejected(self.name, op.results[0], reason + "; kept llm.moe (dense)")
        if changed:
            declare_ort(module)
        return changed

    def _lower(
        self,
        fn: Function,
        g: Graph,
        op: Op,
        fmt: NbitsFormat | None,
        ev: Evaluate,
        ctx: PassContext,
    ) -> str | None:
        at = op.attrs
        x = op.operands[0]
        if tt(x).dtype != DType.f32 or tt(x).rank not in (2, 3):
            return "x is not f32 [tokens, hidden] or [batch, seq, hidden]"
        if at.get("activation", "silu") != "silu":
            return f"onnxruntime's CPU MoE runs SwiGLU experts only, not {at['activation']}"
        weights = [expert_srcs(g, w) for w in op.operands[2:5]]
        if any(w is None for w in weights):
            return "the expert weights are not read from stored tensors"
        srcs: list[list[WSrc]] = [w for w in weights if w is not None]
        scoring = at.get("scoring", "softmax")
        groups = int(at.get("n_group", 1))
        floats = all(s.kind in _FLOAT_KINDS for w in srcs for s in w)
        plan: _Plan | str | None = None
        if not floats or fmt is not None:
            hidden, inter = srcs[2][0].rows, srcs[0][0].rows
            plan = plan_qmoe(srcs, fmt, hidden, inter, ev, self.accuracy_level)
            if isinstance(plan, str):
                return plan
        elif scoring != "softmax" or groups > 1:
            what = "sigmoid scoring" if scoring != "softmax" else "group-limited routing"
            return f"{what} needs router_weights, which only QMoE (quantized experts) takes"
        b, new_ops = scratch_builder(fn, op.origin)
        logits = b.op("core.matmul", x, op.operands[1], transpose_b=True)
        common: dict[str, Any] = {
            "k": int(at["top_k"]),
            "normalize": bool(at.get("norm_topk", True)),
        }
        wts = list(op.operands[2:5])
        if not isinstance(plan, _Plan):
            y = b.op("ort.moe", x, logits, *wts, **common)
            ctx.applied("moe", y, "f32 experts")
        else:
            extra: list[Value] = []
            probs = logits
            if scoring != "softmax" or groups > 1:
                scores = dec_scores(b, logits, scoring)
                probs = dec_group_limit(b, scores, groups, int(at.get("topk_group", 1)))
                extra = [scores]
            y = b.op(
                "ort.qmoe",
                x,
                probs,
                *wts,
                *extra,
                **common,
                bits=plan.bits,
                block_size=plan.block,
                accuracy_level=self.accuracy_level,
                quantize=plan.quantize,
            )
            ctx.applied("qmoe", y, plan.detail)
        scale = float(at.get("routed_scale", 1.0))
        if scale != 1.0:
            from llmir_core.dialects.llm_moe import _const

            y = b.op("core.mul", y, _const(b, scale, x))
        if len(op.operands) >= 8:
            y = b.op("core.add", y, dec_shared(b, x, list(op.operands[5:]), "silu"))
        pos = next(i for i, o in enumerate(fn.ops) if o is op)
        fn.ops[pos:pos] = new_ops
        take_over(fn, op.results[0], y)
        erase_dead(fn, [op])
        return None


__all__ = ["LowerOrtMoe", "expert_srcs", "plan_qmoe"]
