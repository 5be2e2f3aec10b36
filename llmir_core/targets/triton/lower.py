"""lower-triton: llm/core ops become `triton.*` kernel launches with their launch parameters.

Rewrites (each to the triton op with the same operands and results, so the reference semantics
are unchanged): llm.embedding -> triton.embedding; llm.rms_norm / llm.add_rms_norm ->
triton.rms_norm / triton.add_rms_norm; llm.rotary_embedding -> triton.rotary; core.matmul by a
2-D [out, in] matrix (transpose_b) and llm.linear (transpose_b) -> triton.matmul;
llm.gated_mlp -> triton.gated_matmul (gate and up with the activation fused) + triton.matmul
(down); llm.quantized_matmul of GGUF q8_0/q4_0 or symmetric 4/8-bit nbits weights (transpose_b) ->
triton.q_matmul; a KV-cache entry core.concat(past argument, new, axis=2) ->
triton.kv_append{cache_dtype}; llm.scaled_dot_product_attention without mask or softmax_eps ->
triton.attention. Block sizes and warps are chosen from the static dims. -O2's merged q/k/v
projection (merge-qkv: one matmul by the concatenated weight, then core.split) thus becomes one
triton.matmul; the core.split stays (the runner cuts views of the result, as for the other
layout glue). Ops it cannot lower stay as they are (the triton target's capability check names
them). A module with triton ops gets `target = "triton"` (so `llmir build` only serializes it) and
`llmir.source` (the file it was lowered from) when it has none.
The rewrites are a conversion-pattern table (`TABLE`: source op, target op, the function that
gives the launch parameters or the reason it does not apply) run by the rewrite engine
(`passes/rewriting.py:apply_conversions`) with the triton target's capabilities as the legal
set; each conversion is logged as a rule instance named after its row (`lower-triton.matmul`).
Invariant: every function's outputs keep their types, and their values up to the kernels'
rounding (kv_cache=int8: the new KV rows up to the kv-cache-int8 quantization, as declared by
triton.kv_append).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import QuantType, TensorType
from llmir_core.passes.base import PassContext
from llmir_core.passes.rewriting import Conversion, Converted, apply_conversions


def _pow2(n: Any, lo: int = 1, hi: int = 1 << 20) -> int:
    n = n if isinstance(n, int) and n > 0 else lo
    p = 1
    while p < n:
        p *= 2
    return max(lo, min(hi, p))


def _dim(v: Value, i: int) -> Any:
    t = v.type
    return (
        t.shape[i] if isinstance(t, TensorType) and t.rank > abs(i) - (1 if i < 0 else 0) else None
    )


def _mm_blocks(k: Any) -> dict[str, Any]:
    return {
        "block_m": 64,
        "block_n": 64,
        "block_k": 32,
        "gemv_block_n": 32,
        "gemv_block_k": _pow2(k, 16, 256),
        "num_warps": 4,
    }


def _q_ok(t: Any) -> bool:
    if not isinstance(t, TensorType) or not isinstance(t.dtype, QuantType):
        return False
    q = t.dtype
    if q.scheme in ("q8_0", "q4_0"):
        return True
    return (
        q.scheme == "nbits"
        and q.bits in (4, 8)
        and q.zero == "none"
        and q.block >= 16
        and q.block & (q.block - 1) == 0
    )


def _embedding(fn: Function, op: Op) -> Converted | str:
    return Converted({"block_h": _pow2(_dim(op.operands[0], 1), 16, 1024)})


def _rms_norm(fn: Function, op: Op) -> Converted | str:
    block = _pow2(_dim(op.operands[0], -1), 16, 1 << 16)
    return Converted({**op.attrs, "block": block, "num_warps": 4 if block <= 2048 else 8})


def _rotary(fn: Function, op: Op) -> Converted | str:
    return Converted(dict(op.attrs))


def _matmul(fn: Function, op: Op) -> Converted | str:
    w = op.operands[1].type if len(op.operands) == 2 else None
    if not op.attrs.get("transpose_b") or not isinstance(w, TensorType) or w.rank != 2:
        return "not a product by a 2-D [out, in] matrix (transpose_b)"
    return Converted(_mm_blocks(_dim(op.operands[0], -1)))


def _linear(fn: Function, op: Op) -> Converted | str:
    if not op.attrs.get("transpose_b", True):
        return "not a product by an [out, in] matrix (transpose_b)"
    act = op.attrs.get("activation", "none")
    return Converted({"activation": act, **_mm_blocks(_dim(op.operands[0], -1))})


def _gated_mlp(fn: Function, op: Op) -> Converted | str:
    """gate and up with the activation fused (triton.gated_matmul), then down."""
    x, wg, wu, wd = op.operands
    xt, gt = x.type, wg.type
    assert isinstance(xt, TensorType) and isinstance(gt, TensorType)
    gated = Op(
        "triton.gated_matmul",
        [x, wg, wu],
        [TensorType((*xt.shape[:-1], gt.shape[0]), xt.dtype)],
        {"activation": op.attrs.get("activation", "silu"), **_mm_blocks(xt.shape[-1])},
        result_names=[op.results[0].name + ".gated"],
        origin=op.origin,
        pos=op.pos,
    )
    return Converted(_mm_blocks(gt.shape[0]), [gated.results[0], wd], [gated])


def _q_matmul(fn: Function, op: Op) -> Converted | str:
    if not op.attrs.get("transpose_b", True) or len(op.operands) > 3:
        return "not a product by [out, in] codes with scales only"
    if not _q_ok(op.operands[1].type):
        return "weights are not GGUF q8_0/q4_0 or symmetric 4/8-bit nbits blocks"
    return Converted(
        {
            "block_m": 32,
            "block_n": 64,
            "block_k": 64,
            "gemv_block_n": 32,
            "gemv_block_k": _pow2(_dim(op.operands[0], -1), 32, 256),
            "num_warps": 4,
        }
    )


def _attention(fn: Function, op: Op) -> Converted | str:
    a = op.attrs
    if len(op.operands) != 3 or a.get("softmax_eps"):
        return "a mask operand or softmax_eps (no triton kernel)"
    d = _dim(op.operands[0], 3)
    hq, hkv = _dim(op.operands[0], 1), _dim(op.operands[1], 1)
    group = hq // hkv if isinstance(hq, int) and isinstance(hkv, int) and hkv else 1
    bd = _pow2(d, 16)
    attrs: dict[str, Any] = {
        k: a[k] for k in ("causal", "scale", "softcap", "sliding_window") if k in a
    }
    attrs.update(
        {
            "split_k": 0,  # the pass's option, set by its row (LowerTriton.table)
            "decode_block_n": max(16, min(64, 16384 // (_pow2(group) * bd))),
            "block_m": 32 if bd <= 64 else 16,
            "block_n": 32,
            "num_warps": 4,
        }
    )
    return Converted(attrs)


def _kv_append(cache_dtype: str) -> Any:
    def convert(fn: Function, op: Op) -> Converted | str:
        past = op.operands[0] if len(op.operands) == 2 else None
        if op.attrs.get("axis") != 2 or past is None:
            return "not a two-operand concat along axis 2"
        if not any(past is a for a in fn.args):
            return "its first operand is not a cache argument"
        if not isinstance(past.type, TensorType) or past.type.rank != 4:
            return "not a rank-4 KV cache"
        return Converted({"cache_dtype": cache_dtype})

    return convert


def _with_split_k(split_k: int) -> Any:
    def convert(fn: Function, op: Op) -> Converted | str:
        got = _attention(fn, op)
        if isinstance(got, str):
            return got
        return Converted({**got.attrs, "split_k": split_k})

    return convert


def _row(source: str, target: str, convert: Any) -> Conversion:
    return Conversion(f"lower-triton.{target.removeprefix('triton.')}", source, target, convert)


_FIXED = (
    _row("llm.embedding", "triton.embedding", _embedding),
    _row("llm.rms_norm", "triton.rms_norm", _rms_norm),
    _row("llm.add_rms_norm", "triton.add_rms_norm", _rms_norm),
    _row("llm.rotary_embedding", "triton.rotary", _rotary),
    _row("core.matmul", "triton.matmul", _matmul),
    _row("llm.linear", "triton.matmul", _linear),
    _row("llm.gated_mlp", "triton.matmul", _gated_mlp),
    _row("llm.quantized_matmul", "triton.q_matmul", _q_matmul),
)


@dataclass(frozen=True)
class LowerTriton:
    name: ClassVar[str] = "lower-triton"
    summary: ClassVar[str] = "llm/core ops -> triton.* kernel launches with launch parameters"
    kv_cache: str = "native"  # native | int8
    split_k: int = 0  # decode attention cache slices (0: by capacity)

    def table(self) -> tuple[Conversion, ...]:
        """The conversion-pattern table, with this pass's options in the rows that take them."""
        return (
            *_FIXED,
            _row(
                "core.concat",
                "triton.kv_append",
                _kv_append("i8" if self.kv_cache == "int8" else "native"),
            ),
            _row(
                "llm.scaled_dot_product_attention", "triton.attention", _with_split_k(self.split_k)
            ),
        )

    def run(self, module: Module, ctx: PassContext) -> bool:
        from llmir_core.targets.triton.target import CAPABILITIES

        changed = apply_conversions(module, ctx, self.table(), CAPABILITIES.ops.__contains__)
        if changed:
            dialects = list(module.attrs.get("llmir.dialects", ["core"]))
            if "triton" not in dialects:
                module.attrs["llmir.dialects"] = (*dialects, "triton")
        if any(op.name.startswith("triton.") for fn in module.functions for op in fn.ops):
            # lowered: `llmir build` only serializes it (and names the file it was lowered from)
            from llmir_core.targets.onnxruntime.lower_module import source_record

            before = dict(module.attrs)
            module.attrs.setdefault("llmir.source", source_record(module))
            module.attrs["target"] = "triton"
            changed |= module.attrs != before
        return changed
