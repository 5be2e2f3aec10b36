"""lower-ort-weight-dtype: a decoder's f32 matmul weights and embedding table stored in 16 bits
(`llmir build --dtype f16|bf16`), computed in the dtype the capability table allows.

Without --dtype, weights keep the width their source stores: a weight that is the f32 widening
of a stored 16-bit tensor (a GGUF F16/BF16 tensor, a bf16 checkpoint's `core.cast(core.weight)`)
becomes `ort.cast(core.weight)` and the artifact holds its 16-bit bytes (an F16 GGUF builds to
an artifact of the GGUF's size, not twice it); f32 weights stay f32. `--dtype f32` stores every
weight in f32 (no widening when the session loads).

Each static f32 weight W read by an `ort.fused_matmul` (operand 1) or an `llm.embedding` (the
table) becomes `ort.cast(core.cast(W, d), f32)`: the artifact stores the d value (half the f32
bytes) and onnxruntime widens it to f32 once, when the session loads. A weight that already is
the f32 widening of a stored d tensor (a bf16 checkpoint's `core.cast(core.weight bf16)`) keeps
its bytes: `ort.cast(core.weight)`. A weight shared by several ops (a tied embedding and lm_head)
is stored once. The compute dtype comes from the onnxruntime capability table: its CPU provider
has no f16/bf16 GEMM on x86 (`ort.fused_matmul` f16 is `cast`, bf16 absent in
llmir_core/backends/ort_kernels.py), so the matmuls compute in f32. MatMulNBits weights
(`--quant`, GGUF blocks) are not touched. The report gives each weight's max rounding error.

Invariant: only static weights change, each by the d rounding of its values (exact for a weight
stored in d already): validation is differential at the pass's declared tolerance
(`validation_rtol`), and the report gives each weight's max rounding error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Value
from llmir_core.ir.types import DType, TensorType, numpy_dtype

from .base import PassContext, scratch_builder
from .ort_common import Graph, declare_ort, is_decoder, tt

WEIGHT_DTYPES = ("f16", "bf16")


def parse_weight_dtype(dtype: str | None) -> DType | None:
    """`f16`/`bf16` (or ""/None/`f32` for f32 weights) -> the storage dtype."""
    if dtype in (None, "", "f32"):
        return None
    if dtype not in WEIGHT_DTYPES:
        raise InputError(
            f"unknown --dtype '{dtype}'", hint=f"use one of: f32, {', '.join(WEIGHT_DTYPES)}"
        )
    return DType.f16 if dtype == "f16" else DType.bf16


def _label(w: Value) -> str:
    """The checkpoint name of a weight (names joined for a row-concatenation such as packed QKV)."""
    op = w.owner
    if op is None:
        return w.name
    if op.name == "core.concat":
        return "+".join(_label(v) for v in op.operands)
    if op.name == "core.cast" and op.operands:
        return _label(op.operands[0])
    return str(op.attrs.get("name", w.name))


def _stored_16(w: Value) -> DType | None:
    """The 16-bit dtype w is the f32 widening of (`core.cast(core.weight f16|bf16)`, or a
    row-concatenation of such widenings of one dtype, e.g. packed QKV), or None."""
    src = w.owner
    if src is not None and src.name == "core.concat" and src.attrs.get("axis") == 0:
        parts = {_stored_16(o) for o in src.operands}
        return parts.pop() if len(parts) == 1 else None
    if src is None or src.name != "core.cast" or not src.operands:
        return None
    inner = src.operands[0]
    dt = tt(inner).dtype
    if dt not in (DType.f16, DType.bf16) or inner.owner is None:
        return None
    return dt if inner.owner.name == "core.weight" else None


@dataclass(frozen=True)
class LowerOrtWeightDtype:
    name: ClassVar[str] = "lower-ort-weight-dtype"
    summary: ClassVar[str] = (
        "decoder matmul weights and embedding table stored in f16/bf16, widened at load"
    )
    dtype: str = ""  # f16 | bf16 | f32 ("": each weight in the width its source stores)
    # --verify-each compares outputs differentially at this relative tolerance (bf16 rounds each
    # weight by up to 2^-9 of its magnitude; f16 by 2^-12), scaled by depth
    validation_rtol: ClassVar[float] = 2e-2

    def run(self, module: Module, ctx: PassContext) -> bool:
        d = parse_weight_dtype(self.dtype)
        keep = self.dtype == ""  # the default: 16-bit stored weights stay 16-bit
        if (d is None and not keep) or not is_decoder(module):
            return False
        from .static_eval import static_value

        changed = False
        for fn in module.functions:
            g = Graph(fn)
            done: dict[int, Value] = {}
            for op in list(fn.ops):
                slot = {"ort.fused_matmul": 1, "llm.embedding": 0}.get(op.name)
                if slot is None or slot >= len(op.operands):
                    continue
                w = op.operands[slot]
                t = w.type
                if (
                    id(w) not in g.static
                    or not isinstance(t, TensorType)
                    or t.dtype != DType.f32
                    or t.rank != 2
                    or (w.owner is not None and w.owner.name == "ort.cast")
                ):
                    continue
                wd = d if d is not None else _stored_16(w)
                if wd is None:
                    continue
                if id(w) not in done:
                    done[id(w)] = self._store(fn, w, wd, ctx, module, static_value)
                op.operands[slot] = done[id(w)]
                changed = True
        if changed:
            declare_ort(module)
        return changed

    def _store(
        self, fn: Function, w: Value, d: DType, ctx: PassContext, module: Module, sv
    ) -> Value:  # type: ignore[no-untyped-def]
        src = w.owner
        b, new_ops = scratch_builder(fn, src.origin if src is not None else None)
        stored = None
        if src is not None and src.name == "core.cast" and tt(src.operands[0]).dtype == d:
            stored = src.operands[0]  # already stored in d: keep its bytes
            err = 0.0
        if stored is None:
            stored = b.op("core.cast", w, to=d)
            arr = sv(module, w)
            err = (
                float(np.abs(arr.astype(numpy_dtype(d)).astype(np.float32) - arr).max())
                if arr is not None and arr.size
                else float("nan")
            )
        wide = b.op("ort.cast", stored, to=DType.f32)
        i = next(i for i, o in enumerate(fn.ops) if o is src) + 1 if src is not None else 0
        fn.ops[i:i] = new_ops
        label = _label(w)
        ctx.applied(
            "weight-dtype",
            wide,
            f"{label}: stored in {d}, widened to f32 at load (max abs rounding error {err:.3g}); "
            "onnxruntime's CPU provider has no 16-bit GEMM here, so the matmul computes in f32",
        )
        return wide


__all__ = ["LowerOrtWeightDtype", "WEIGHT_DTYPES", "parse_weight_dtype"]
