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


@dataclass(frozen=True)
class LowerTriton:
    name: ClassVar[str] = "lower-triton"
    summary: ClassVar[str] = "llm/core ops -> triton.* kernel launches with launch parameters"
    kv_cache: str = "native"  # native | int8
    split_k: int = 0  # decode attention cache slices (0: by capacity)

    def run(self, module: Module, ctx: PassContext) -> bool:
        changed = False
        for fn in module.functions:
            changed |= self._lower(fn, ctx)
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

    def _lower(self, fn: Function, ctx: PassContext) -> bool:
        args = {id(a) for a in fn.args}
        out: list[Op] = []
        changed = False
        for op in fn.ops:
            new = self._rewrite(op, args, out)
            if new:
                changed = True
                ctx.applied(
                    "lower-triton", op.results[0], f"{op.name} -> {op.name if new is True else new}"
                )
            out.append(op)
        fn.ops = out
        return changed

    def _rewrite(self, op: Op, args: set[int], out: list[Op]) -> bool | str:
        # long: a dispatch table: one branch per llm op it lowers (another helper is rewriting this pass)
        a = op.attrs
        n = op.name
        if n == "llm.embedding":
            op.name, op.attrs = (
                "triton.embedding",
                {"block_h": _pow2(_dim(op.operands[0], 1), 16, 1024)},
            )
        elif n in ("llm.rms_norm", "llm.add_rms_norm"):
            h = _dim(op.operands[0], -1)
            block = _pow2(h, 16, 1 << 16)
            op.name = n.replace("llm.", "triton.")
            op.attrs = {**a, "block": block, "num_warps": 4 if block <= 2048 else 8}
        elif n == "llm.rotary_embedding":
            op.name = "triton.rotary"
        elif (
            n == "core.matmul"
            and a.get("transpose_b")
            and len(op.operands) == 2
            and isinstance(op.operands[1].type, TensorType)
            and op.operands[1].type.rank == 2
        ):
            op.name, op.attrs = "triton.matmul", _mm_blocks(_dim(op.operands[0], -1))
        elif n == "llm.linear" and a.get("transpose_b", True):
            op.name = "triton.matmul"
            op.attrs = {
                "activation": a.get("activation", "none"),
                **_mm_blocks(_dim(op.operands[0], -1)),
            }
        elif n == "llm.gated_mlp":
            x, wg, wu, wd = op.operands
            xt, gt = x.type, wg.type
            assert isinstance(xt, TensorType) and isinstance(gt, TensorType)
            h_t = TensorType((*xt.shape[:-1], gt.shape[0]), xt.dtype)
            gated = Op(
                "triton.gated_matmul",
                [x, wg, wu],
                [h_t],
                {"activation": a.get("activation", "silu"), **_mm_blocks(xt.shape[-1])},
                result_names=[op.results[0].name + ".gated"],
                origin=op.origin,
                pos=op.pos,
            )
            out.append(gated)
            op.name, op.operands = "triton.matmul", [gated.results[0], wd]
            op.attrs = _mm_blocks(gt.shape[0])
            return "triton.gated_matmul + triton.matmul"
        elif (
            n == "llm.quantized_matmul"
            and a.get("transpose_b", True)
            and len(op.operands) <= 3
            and _q_ok(op.operands[1].type)
        ):
            op.name = "triton.q_matmul"
            op.attrs = {
                "block_m": 32,
                "block_n": 64,
                "block_k": 64,
                "gemv_block_n": 32,
                "gemv_block_k": _pow2(_dim(op.operands[0], -1), 32, 256),
                "num_warps": 4,
            }
        elif (
            n == "core.concat"
            and a.get("axis") == 2
            and len(op.operands) == 2
            and id(op.operands[0]) in args
            and isinstance(op.operands[0].type, TensorType)
            and op.operands[0].type.rank == 4
        ):
            op.name = "triton.kv_append"
            op.attrs = {"cache_dtype": "i8" if self.kv_cache == "int8" else "native"}
        elif (
            n == "llm.scaled_dot_product_attention"
            and len(op.operands) == 3
            and not a.get("softmax_eps")
        ):
            d = _dim(op.operands[0], 3)
            hq, hkv = _dim(op.operands[0], 1), _dim(op.operands[1], 1)
            group = hq // hkv if isinstance(hq, int) and isinstance(hkv, int) and hkv else 1
            bd = _pow2(d, 16)
            op.name = "triton.attention"
            op.attrs = {k: a[k] for k in ("causal", "scale", "softcap", "sliding_window") if k in a}
            op.attrs.update(
                {
                    "split_k": self.split_k,
                    "decode_block_n": max(16, min(64, 16384 // (_pow2(group) * bd))),
                    "block_m": 32 if bd <= 64 else 16,
                    "block_n": 32,
                    "num_warps": 4,
                }
            )
        else:
            return False
        return True
