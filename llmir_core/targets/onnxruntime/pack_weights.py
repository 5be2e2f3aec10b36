"""pack-ort-weights: the storage format of each packed weight becomes an `ort.pack` op.

The lowering passes choose each weight's format through the op that reads it; this pass, the
last before lower-ort-module, writes that choice into the module as an `ort.pack` between the
weight and its reader, so the serializer evaluates each `ort.pack` into its initializers and
decides nothing:

- `ort.matmul_f32 {layout = "panel16"}` reads `ort.pack {format = "panel16"}` of its weight;
- `ort.matmul_nbits` over a float weight and `ort.gather_block_quantized` read
  `ort.pack {format = "nbits"}` with the reader's bits and block size, its `quantize` and
  `scale_dtype` (the reader's become "none"/"f32": it reads blocks that are already rounded),
  and `zero_points` when the blocks store them: the reader rounds with zero points (asym), or a
  part of its weight (an nbits or checkpoint-packed weight of a row-concatenation) has them.

One `ort.pack` serves every reader of the same weight in the same format (a tied lm_head and
its embedding lookup store their blocks once). Weights of other readers (the 16-bit casts are
already `core.cast` ops; `ort.matmul_s8`, `ort.dynamic_quantize_matmul`, `ort.matmul_gguf`,
`ort.moe`/`ort.qmoe` and the packed-operand form of `ort.matmul_nbits`) are still packed by the
serializer.

Invariant: every value keeps its meaning: a reader of a lossless pack reads w itself; a
requantizing reader's rounding moves onto its pack (`llm.quantize` then the blocks read back, the
same term the reader's own rounding was). Idempotent: a reader of an `ort.pack` is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import QuantType
from llmir_core.passes.base import PassContext, scratch_builder
from llmir_core.quant.gguf_repack import REQUANT
from llmir_core.targets.onnxruntime.lower_common import (
    Evaluate,
    Graph,
    WSrc,
    is_decoder,
    packed_asym,
    static_evaluator,
    tt,
    weight_srcs,
)


@dataclass(frozen=True)
class PackOrtWeights:
    name: ClassVar[str] = "pack-ort-weights"
    summary: ClassVar[str] = (
        "the storage format of panel16 and MatMulNBits weights -> ort.pack ops the serializer "
        "writes 1:1"
    )

    def run(self, module: Module, ctx: PassContext) -> bool:
        if not is_decoder(module):
            return False
        ev = static_evaluator(module)
        changed = False
        for fn in module.functions:
            made: dict[tuple[int, tuple[Any, ...]], Value] = {}
            g = Graph(fn)
            for op in list(fn.ops):
                attrs = _pack_attrs(g, op, ev)
                if attrs is None:
                    continue
                slot = 0 if op.name == "ort.gather_block_quantized" else 1
                w = op.operands[slot]
                key = (id(w), tuple(sorted(attrs.items())))
                if key not in made:
                    made[key] = _insert(fn, op, w, attrs)
                    ctx.applied(self.name, made[key], _detail(attrs))
                op.operands[slot] = made[key]
                for k in ("quantize", "scale_dtype"):
                    op.attrs.pop(k, None)  # the reader's rounding moved onto its pack
                if op.name != "ort.matmul_f32":
                    op.attrs["quantize"] = "none"
                changed = True
        return changed


def _insert(fn: Function, reader: Op, w: Value, attrs: dict[str, Any]) -> Value:
    """An ort.pack of w, placed just before `reader` and tagged with its location (the
    serializer names the initializers after it)."""
    b, new_ops = scratch_builder(fn, reader.origin)
    packed = b.create("ort.pack", [w], attrs).results[0]
    at = fn.ops.index(reader)
    fn.ops[at:at] = new_ops
    return packed


def _detail(attrs: dict[str, Any]) -> str:
    if attrs["format"] != "nbits":
        return str(attrs["format"])
    zp = ", zero points" if attrs.get("zero_points") else ""
    return f"int{attrs['bits']} block {attrs['block_size']} {attrs['quantize']}{zp}"


def _is_pack(v: Value) -> bool:
    return v.owner is not None and v.owner.name == "ort.pack"


def _pack_attrs(g: Graph, op: Op, ev: Evaluate) -> dict[str, Any] | None:
    """The ort.pack attributes of the weight `op` reads, or None when it reads no weight this
    pass packs (or already reads a pack)."""
    if op.name == "ort.matmul_f32":
        if op.attrs.get("layout", "rows") != "panel16" or _is_pack(op.operands[1]):
            return None
        return {"format": "panel16"}
    if op.name == "ort.gather_block_quantized":
        if _is_pack(op.operands[0]):
            return None
        return _nbits_attrs(op, False)
    if op.name != "ort.matmul_nbits" or len(op.operands) != 2 or _is_pack(op.operands[1]):
        return None
    srcs = weight_srcs(g, op.operands[1])
    if srcs is None:
        return None  # not a static weight: the serializer says so
    return _nbits_attrs(op, _zero_points(op, srcs, ev))


def _nbits_attrs(op: Op, zero_points: bool) -> dict[str, Any]:
    at = op.attrs
    quantize = str(at.get("quantize", "none"))
    if zero_points and quantize == "sym":
        quantize = "asym"  # a part has zero points: the blocks store them for every part
    out: dict[str, Any] = {
        "format": "nbits",
        "bits": int(at["bits"]),
        "block_size": int(at["block_size"]),
        "quantize": quantize,
    }
    if zero_points:
        out["zero_points"] = True
    if at.get("scale_dtype", "f32") != "f32":
        out["scale_dtype"] = str(at["scale_dtype"])
    return out


def _zero_points(op: Op, srcs: list[WSrc], ev: Evaluate) -> bool:
    """Whether MatMulNBits' blocks of these parts store zero points: the reader rounds with
    them, or a part is an nbits weight with zero points or a checkpoint weight packed so."""
    if op.attrs.get("quantize") == "asym":
        return True
    kinds = {s.kind for s in srcs}
    if not (kinds & {"nbits", "packed"} or {s.scheme for s in srcs} & set(REQUANT)):
        return False
    return any(s.kind == "nbits" and _zero(s) for s in srcs) or any(
        s.kind == "packed" and packed_asym(s, ev) for s in srcs
    )


def _zero(s: WSrc) -> bool:
    assert s.op is not None
    q = tt(s.op.results[0]).dtype
    return isinstance(q, QuantType) and q.zero == "int"
