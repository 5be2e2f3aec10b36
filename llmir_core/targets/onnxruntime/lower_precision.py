"""lower-ort-precision: every op left computing in a 16-bit float dtype that onnxruntime's CPU
provider has no kernel for (the onnxruntime capability table, llmir_core/targets/onnxruntime/kernel_table.py)
computes in f32 between explicit casts.

An op K whose float operands and results are all of one dtype d (f16 or bf16) becomes
`cast(K(cast(a0, f32), ...), d)` (each float result cast back to d) when the table has no d
kernel for K (a bf16 model would fail to load: "Could not find an implementation") or only
computes it through onnxruntime's own f32 casts (f16 on x86: the casts become visible in the
lowered file). Ops computed from constants only are left alone (the serializer evaluates them).
An op that cannot be rewritten this way (mixed 16-bit dtypes, an op whose result type does not
follow its operands) is left as is and `lower-ort-module` refuses it with the table's reason.

Invariant: each rewritten op computes its f32 result from the exact f32 widening of its operands
and rounds it to d once, as a d kernel that accumulates in f32 does; the signature is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, TensorType
from llmir_core.passes.base import PassContext, erase_dead, scratch_builder, take_over
from llmir_core.targets.onnxruntime.lower_common import TARGET

NARROW = (DType.f16, DType.bf16)
_KEEP = ("core.cast", "ort.cast", "onnx.opaque", "core.weight", "core.constant")


def _narrow(v: Value) -> DType | None:
    t = v.type
    if isinstance(t, TensorType) and t.dtype in NARROW:
        return t.dtype  # type: ignore[return-value]
    return None


def _static_ops(fn: Function) -> set[int]:
    """Values computed from constants only (the serializer evaluates them at build time)."""
    static: set[int] = set()
    for op in fn.ops:
        od = get_op(op.name)
        if op.name in ("core.weight", "core.constant") or (
            od is not None
            and od.reference is not None
            and not od.effects
            and bool(op.operands)
            and all(id(v) in static for v in op.operands)
        ):
            static.update(id(r) for r in op.results)
    return static


@dataclass(frozen=True)
class LowerOrtPrecision:
    name: ClassVar[str] = "lower-ort-precision"
    summary: ClassVar[str] = (
        "ops in f16/bf16 onnxruntime's CPU has no kernel for compute in f32 between casts"
    )

    def run(self, module: Module, ctx: PassContext) -> bool:
        from llmir_core.targets import get_target

        caps = get_target(TARGET).capabilities
        changed = False
        for fn in module.functions:
            static = _static_ops(fn)
            for op in list(fn.ops):
                if op.name in _KEEP or all(id(r) in static for r in op.results):
                    continue
                dts = {d for v in [*op.operands, *op.results] if (d := _narrow(v)) is not None}
                how = {d: caps.kernel(op.name, d) for d in dts}
                if not dts or all(k == "native" for k in how.values()):
                    continue
                if len(dts) != 1:
                    ctx.rejected(
                        "precision-f32-compute",
                        op.results[0],
                        f"{op.name} mixes {', '.join(sorted(map(str, dts)))}",
                    )
                    continue
                d = dts.pop()
                changed |= self._rewrite(fn, op, d, how[d], ctx)
        return changed

    def _rewrite(self, fn: Function, op: Op, d: DType, how: str | None, ctx: PassContext) -> bool:
        b, new_ops = scratch_builder(fn, op.origin)
        ins = [b.op("core.cast", v, to=DType.f32) if _narrow(v) == d else v for v in op.operands]
        try:
            wide = b.create(op.name, ins, dict(op.attrs))
        except Exception as e:  # noqa: BLE001 - the op does not take f32 operands this way
            ctx.rejected("precision-f32-compute", op.results[0], f"{op.name} in f32: {e}")
            return False
        outs: list[Value] = []
        for old, new in zip(op.results, wide.results):
            ot, nt = old.type, new.type
            assert isinstance(ot, TensorType)
            want = (
                TensorType(ot.shape, DType.f32, ot.layout, ot.device, ot.sema)
                if ot.dtype == d
                else ot
            )
            if not isinstance(nt, TensorType) or nt.dtype != want.dtype or nt.shape != want.shape:
                ctx.rejected(
                    "precision-f32-compute",
                    op.results[0],
                    f"{op.name} in f32 gives {nt}, not {want}",
                )
                return False
            outs.append(b.op("core.cast", new, to=d) if ot.dtype == d else new)
        i = next(i for i, o in enumerate(fn.ops) if o is op)
        fn.ops[i:i] = new_ops
        for old, new in zip(op.results, outs):
            take_over(fn, old, new)
        erase_dead(fn, [op])
        why = (
            "no kernel (the model would not load)"
            if how is None
            else "onnxruntime would cast it to f32 itself"
        )
        ctx.applied(
            "precision-f32-compute", outs[0], f"{op.name} computes in f32 between {d} casts: {why}"
        )
        return True


__all__ = ["LowerOrtPrecision"]
