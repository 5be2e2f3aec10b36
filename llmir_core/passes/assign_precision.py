"""assign-precision: dtype and device assignment from a per-target capability table, with
explicit conversions (`core.cast`, `llm.to_device`) and weight reorders (`core.transpose`),
applied through the rewrite engine (one rewrite per op, one rule per result).

Rewrite: walking the function in order, each op the target supports (the op classes of
`llmir_core.rewrite.precision_rules.OP_CLASSES`) is computed on the target device in a dtype
chosen layer by layer: `low` ops (matmul, linear, gated MLP, attention, quantized matmul) in the
target's low precision, `f32` ops (norms, softmax, reductions, exp/log, rotary, lookups) in f32,
`follow` ops (elementwise, shape) in the low precision exactly when every run-time float operand
comes from a low op (parameters adapt to any precision). Integer shape arithmetic stays on the host. Each such op K becomes
`restore(K(prep(a0), ..))` (rules precision-*): its operands are moved to the device with
`llm.to_device` (which sets the tensor type's `device` and, for matmul weights, `layout`) and
cast to the op's dtype; its results are cast back and moved to the host. A parameter matrix
stored in the other layout than the target's (`nk` = [out, in], `kn` = [in, out]) is transposed
once at load time (rules precision-core-matmul-reorder-*). Ops the target does not support stay
on the host, reading host values. Run `canonicalize` after it: it folds the conversion round
trips between neighbouring ops (cast-roundtrip-*, to-device-roundtrip), leaving conversions only
where precision or device really changes.
Invariant: the signature is unchanged (arguments are converted on entry, results on exit); a
value's dtype narrows only at a cast into a low op, and every op reads its operands in the dtype
and on the device it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.dialects.registry import get_op
from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DTYPE_NAMES, DType, TensorType
from llmir_core.rewrite.library import RULES
from llmir_core.rewrite.precision_rules import (
    MOVE_ONLY,
    OP_CLASSES,
    arities,
    reorder_rule,
    rule_name,
)
from llmir_core.rewrite.terms import Match

from .base import PassContext
from .rewriting import Part, rewrite
from .static_eval import static_slice


@dataclass(frozen=True)
class Target:
    """One row of the capability table."""

    device: str
    dtypes: tuple[DType, ...]  # float dtypes its kernels compute in
    low: DType  # what `dtype=auto` picks for low ops
    weight_layout: str  # the matmul weight layout its GEMMs read: nk ([out, in]) or kn ([in, out])


TARGETS: dict[str, Target] = {
    # CPU GEMMs (MLAS / oneDNN sgemm) read B as [K, N]; bf16 only pays with AMX/AVX512-BF16
    "cpu": Target("cpu", (DType.f32, DType.bf16), DType.f32, "kn"),
    # tensor-core GEMMs read K-major operands: weights [N, K]; f16 (or bf16) in, f32 accumulate
    "cuda": Target("cuda", (DType.f16, DType.bf16, DType.f32), DType.f16, "nk"),
}


def _float(v: Value) -> bool:
    return (
        isinstance(v.type, TensorType) and isinstance(v.type.dtype, DType) and v.type.dtype.is_float
    )


@dataclass(frozen=True)
class AssignPrecision:
    name: ClassVar[str] = "assign-precision"
    summary: ClassVar[str] = (
        "dtype/device assignment from a target capability table (casts, transfers, reorders)"
    )
    target: str = "cuda"
    dtype: str = "auto"  # the low precision: auto (the target's), or one the target supports

    def _target(self) -> tuple[Target, DType]:
        tgt = TARGETS.get(self.target)
        if tgt is None:
            raise InputError(
                f"assign-precision{{target={self.target}}}: unknown target",
                hint="targets: " + ", ".join(TARGETS),
            )
        low = tgt.low if self.dtype == "auto" else DTYPE_NAMES.get(self.dtype)
        if low not in tgt.dtypes:
            raise InputError(
                f"assign-precision{{dtype={self.dtype}}}: target {self.target} computes in "
                + ", ".join(str(d) for d in tgt.dtypes)
            )
        return tgt, low  # type: ignore[return-value]

    def run(self, module: Module, ctx: PassContext) -> bool:
        tgt, low = self._target()
        changed = False
        for fn in module.functions:
            changed |= self._run_fn(fn, ctx, tgt, low)
        return changed

    def _run_fn(self, fn: Function, ctx: PassContext, tgt: Target, low: DType) -> bool:
        is_low: set[int] = set()  # values computed in the low precision (by id)
        static: set[int] = set()  # parameters and values computed from them alone
        changed = False
        for op in list(fn.ops):
            if not op.operands or static_slice(op.results[0]) is not None:
                static.update(id(r) for r in op.results)
                continue
            rule, reorder = self._rule_for(op, tgt, static)
            if rule is None:
                continue
            dt = self._dtype(op, low, is_low, static)
            changed |= self._rewrite(fn, op, ctx, tgt, dt, rule, reorder, is_low)
        return changed

    def _rule_for(self, op: Op, tgt: Target, static: set[int]) -> tuple[str | None, bool]:
        kind = op.name
        if (
            kind not in OP_CLASSES
            or len(op.operands) not in arities(kind)
            or not all(isinstance(v.type, TensorType) for v in [*op.operands, *op.results])
        ):
            return None, False
        od = get_op(kind)
        if od is None or (od.variadic_results and len(op.results) != len(od.results)):
            return None, False
        if not any(_float(v) for v in [*op.operands, *op.results]):
            return None, False  # shape arithmetic on integers stays on the host
        if (
            kind == "core.matmul"
            and id(op.operands[1]) in static
            and isinstance(op.operands[1].type, TensorType)
            and op.operands[1].type.rank == 2
        ):
            tb = bool(op.attrs.get("transpose_b"))
            if (tgt.weight_layout == "nk") != tb:
                return reorder_rule(tgt.weight_layout), True
        return rule_name(kind, len(op.operands), 0), False

    def _dtype(self, op: Op, low: DType, is_low: set[int], static: set[int]) -> DType:
        cls = OP_CLASSES[op.name]
        if cls == "low":
            return low
        if cls == "f32":
            return DType.f32
        live = [v for v in op.operands if _float(v) and id(v) not in static]
        return low if live and all(id(v) in is_low for v in live) else DType.f32

    def _rewrite(
        self,
        fn: Function,
        op: Op,
        ctx: PassContext,
        tgt: Target,
        dt: DType,
        rule: str,
        reorder: bool,
        is_low: set[int],
    ) -> bool:
        od = get_op(op.name)
        assert od is not None
        seed = Match()
        seed.attrs = od.with_defaults(op.attrs)
        seed.attrs["__dev"] = tgt.device
        for i, v in enumerate(op.operands):
            seed.values[f"a{i}"] = v
            vt = v.type
            assert isinstance(vt, TensorType)
            seed.attrs[f"__to{i}"] = (
                dt if _float(v) and i not in MOVE_ONLY.get(op.name, ()) else vt.dtype
            )
            seed.attrs[f"__lay{i}"] = (
                tgt.weight_layout if op.name == "core.matmul" and i == 1 and reorder else ""
            )
        detail = f"{op.name} on {tgt.device} in {dt}" + (
            f", weight reordered to {tgt.weight_layout}" if reorder else ""
        )
        parts = [
            Part(
                RULES[rule if r_i == 0 else rule_name(op.name, len(op.operands), r_i)],
                old,
                {"__back": old.type.dtype},
                detail if r_i == 0 else "",
            )  # type: ignore[union-attr]
            for r_i, old in enumerate(op.results)
        ]
        if rewrite(fn, ctx, parts, seed) is not None:
            return False
        for p in parts:
            assert p.replacement is not None and p.replacement.owner is not None
            cast = p.replacement.owner.operands[0].owner  # restore(y) = to_device(cast(y))
            assert cast is not None
            inner = cast.operands[0]
            if dt != DType.f32 and isinstance(inner.type, TensorType) and inner.type.dtype == dt:
                is_low.add(id(p.replacement))
        return True
