"""lower-ort-logits: a decoder built for generation computes its logits for the last position only.

Generation reads only the last position's logits, but the imported decoder computes the output
projection (the largest matmul: vocab x hidden) for every position of the prompt, and the last
layer's attention output projection, residual adds, norms and MLP for every position too, though
nothing but the logits reads them. This pass takes `logits[:, -1:, :]` (`core.gather` of index
[-1] on the sequence axis) and moves it up through every op that is position-wise on that axis (elementwise
ops, norms over the last axis, matmuls by static weights, gated MLPs, MoE) and whose results
feed only the logits, stopping at the first op that mixes positions or whose result something
else reads (attention, whose cache outputs need every position, and the residual stream the last
layer's attention reads). The ops above the slices run on one position per sequence.

Runs last among the decoder lowerings (it sees the `ort.*` ops), only with `last=true` (the
onnxruntime target's `last_logits` option, on by default); an artifact built with `--logits all`
keeps every position (perplexity, `llmir run --tensors`).

Invariant: the logits result equals the original's `[:, -1:, :]` (its type's sequence dim
becomes 1); every other result is unchanged. The interface changes, so translation validation
(`validate`, `verify --against`) compares such a module against the original with that gather
appended (`last_logits_interface`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from llmir_core.builder import Builder
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.dims import DYN
from llmir_core.ir.types import TensorType
from llmir_core.passes.base import PassContext, clone_module
from llmir_core.targets.onnxruntime.lower_common import Graph, is_decoder, tt

# elementwise ops: every operand is an activation or a static value broadcast along the sequence
ELEMENTWISE = frozenset(
    {
        "core.add",
        "core.sub",
        "core.mul",
        "core.div",
        "core.pow",
        "core.neg",
        "core.exp",
        "core.sqrt",
        "core.erf",
        "core.tanh",
        "core.sigmoid",
        "core.relu",
        "core.silu",
        "core.gelu",
        "core.cast",
        "ort.quick_gelu",
    }
)
# position-wise ops with these activation operands [B, S, ...]; the other operands are static
# weights (matmuls by them, norms over the last axis, gated MLPs, per-token expert routing)
ROWWISE: dict[str, tuple[int, ...]] = {
    "core.matmul": (0,),
    "ort.fused_matmul": (0,),
    "ort.matmul_nbits": (0,),
    "ort.matmul16": (0,),
    "ort.matmul_f32": (0,),
    "ort.matmul_s8": (0,),  # rounds its activations per row: each position on its own
    "llm.linear": (0,),
    "llm.quantized_matmul": (0,),
    "llm.gated_mlp": (0,),
    "llm.moe": (0,),
    "llm.silu_mul": (0, 1),
    "llm.rms_norm": (0,),
    "llm.layer_norm": (0,),
    "llm.add_rms_norm": (0, 1),
    "ort.simplified_layer_norm": (0,),
    "ort.skip_simplified_layer_norm": (0, 1),
}


def _last_index(b: Builder) -> Value:
    return b.op(
        "core.constant", value=DenseAttr(np.array([-1], np.int64)), name_hint="last_position"
    )


def with_last_logits(module: Module) -> Module:
    """A copy of module whose first result is its logits' last position (`core.gather`)."""
    m = clone_module(module)
    fn = m.main
    b = Builder(fn)
    b.origin = fn.outputs[0].owner.origin if fn.outputs[0].owner is not None else None
    fn.outputs[0] = b.op("core.gather", fn.outputs[0], _last_index(b), axis=1)
    return m


def last_logits_interface(before: Module, after: Module) -> Module | None:
    """`with_last_logits(before)` when `after` is `before` with last-position logits (the same
    signature but the logits' sequence dim 1; an int8 KV cache in place of the f32 one may also
    differ, which validation compares on its own terms), else None."""
    from llmir_core.smt import kv_int8
    from llmir_core.smt.tv import signature_mismatch

    if not before.functions or not after.functions or not is_decoder(before):
        return None
    a, b = before.main.outputs, after.main.outputs
    if len(a) != len(b) or not b or not isinstance(b[0].type, TensorType):
        return None
    t = b[0].type
    if t.rank != 3 or t.shape[1] != 1 or tt(a[0]).shape[1] == 1:
        return None
    last = with_last_logits(before)
    if signature_mismatch(last, after) is None or kv_int8.int8_interface(last, after) is not None:
        return last
    return None


@dataclass(frozen=True)
class LowerOrtLogits:
    name: ClassVar[str] = "lower-ort-logits"
    summary: ClassVar[str] = (
        "logits for the last position only: the slice moved up through position-wise ops"
    )
    last: bool = True

    def run(self, module: Module, ctx: PassContext) -> bool:
        if not self.last or not is_decoder(module):
            return False
        fn = module.main
        logits = fn.outputs[0]
        t = tt(logits)
        if t.rank != 3 or t.shape[1] == 1:
            return False
        seq = t.shape[1]
        g = Graph(fn)
        # an anonymous `?` equals every other `?`: only a named (or static) length is followed
        keep = self._positionwise(fn, g, seq) if seq is not DYN else set()
        new_ops: list[Op] = []
        b = Builder(fn, ops=new_ops)
        new_of: dict[int, Value] = {}
        sliced: dict[int, Value] = {}
        index: list[Value] = []

        def last(v: Value, origin: str | None) -> Value:
            if id(v) not in sliced:
                b.origin = origin
                if not index:
                    index.append(_last_index(b))
                sliced[id(v)] = b.op("core.gather", v, index[0], axis=1, name_hint=f"{v.name}.last")
            return sliced[id(v)]

        renames: list[tuple[Value, Value]] = []
        for op in fn.ops:
            if id(op) not in keep:
                new_ops.append(op)
                continue
            operands = [
                new_of[id(v)]
                if id(v) in new_of
                else (last(v, op.origin) if self._along_seq(v, op, seq) else v)
                for v in op.operands
            ]
            b.origin = op.origin
            new = b.create(op.name, operands, dict(op.attrs))
            for old, nv in zip(op.results, new.results):
                new_of[id(old)] = nv
                renames.append((old, nv))
        out = new_of.get(id(logits)) or last(logits, logits.owner.origin if logits.owner else None)
        fn.ops[:] = new_ops
        fn.outputs[0] = out
        for old, nv in renames:
            nv.name = old.name
        ctx.applied(
            "last-position-logits",
            out,
            f"{len(keep)} ops computed for the last position only",
        )
        return True

    def _along_seq(self, v: Value, op: Op, seq: object) -> bool:
        """v is an activation of op with the sequence axis (sliced with the op)."""
        x = v.type
        return (
            isinstance(x, TensorType)
            and x.rank == tt(op.results[0]).rank
            and x.rank >= 2
            and x.shape[1] == seq
        )

    def _eligible(self, op: Op, g: Graph, seq: object) -> bool:
        if not op.results or any(
            not isinstance(r.type, TensorType)
            or tt(r).rank < 2
            or tt(r).shape[1] != seq
            or tt(r).shape[1] == 1
            for r in op.results
        ):
            return False
        rank = tt(op.results[0]).rank
        if op.name in ELEMENTWISE:
            for v in op.operands:
                if self._along_seq(v, op, seq):
                    continue
                x = tt(v)
                axis = 1 - (rank - x.rank)  # the sequence axis in v after broadcasting
                if id(v) not in g.static or (axis >= 0 and x.shape[axis] != 1):
                    return False
            return True
        acts = ROWWISE.get(op.name)
        if acts is None or op.attrs.get("transpose_a"):
            return False
        for i, v in enumerate(op.operands):
            if i in acts:
                if not self._along_seq(v, op, seq):
                    return False
            elif id(v) not in g.static:
                return False
        return True

    def _positionwise(self, fn: Function, g: Graph, seq: object) -> set[int]:
        """ids of the ops that can run on the last position alone: position-wise, and each result
        read only by such ops (or it is the logits)."""
        logits = fn.outputs[0]
        keep: set[int] = set()
        for op in reversed(fn.ops):
            if not self._eligible(op, g, seq):
                continue
            ok = True
            for r in op.results:
                if id(r) in g.outputs and (r is not logits or sum(o is r for o in fn.outputs) != 1):
                    ok = False
                    break
                if any(id(u) not in keep for u in g.uses(r)):
                    ok = False
                    break
            if ok:
                keep.add(id(op))
        return keep


__all__ = ["LowerOrtLogits", "with_last_logits", "last_logits_interface", "ELEMENTWISE", "ROWWISE"]
