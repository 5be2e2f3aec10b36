"""lower-ort-weight-dtype: a decoder's f32 matmul weights and embedding table stored in 16 bits
(`llmir build --dtype f16|bf16`), computed in the dtype the capability table allows.

Without --dtype, weights keep the width their source stores: a weight that is the f32 widening
of a stored 16-bit tensor (a GGUF F16/BF16 tensor, a bf16 checkpoint's `core.cast(core.weight)`,
a row-concatenation of such as packed QKV) is handled as under `--dtype` of that width, so the
artifact holds its 16-bit bytes (an F16 GGUF builds to an artifact of the GGUF's size, not twice
it); f32 weights stay f32. `--dtype f32` stores every weight in f32 (no widening at load).

Each static f32 weight W read by an `ort.fused_matmul` (operand 1) or an `llm.embedding` (the
table) is stored in d (half the f32 bytes): `core.cast(W, d)`, or the d tensor itself when W
already is the f32 widening of one (a bf16 checkpoint's `core.cast(core.weight bf16)`). A weight
shared by several ops (a tied embedding and lm_head) is stored once. Then, per use:

- `ort.fused_matmul(x, W)` with transB becomes `ort.matmul16(x, W_d)`: llmir's onnxruntime custom
  op (llmir_core/targets/onnxruntime/native) reads the 16-bit weight as stored and widens it in registers,
  in a build for cpu=x86-64-v3 (the `cpu` option's default: AVX2, FMA and F16C; `kernel =
  "auto"` and `"custom"` alike; the machine is checked when the artifact opens, never here),
  not for cpu=x86-64 (`custom` is then an error), `kernel = "f32"` never does;
- otherwise `ort.cast(W_d, f32)`: onnxruntime widens the weight to f32 once, when the session
  loads, and the matmul computes in f32 (its CPU provider has no f16/bf16 GEMM on x86:
  `ort.fused_matmul` f16 is `cast`, bf16 absent in llmir_core/targets/onnxruntime/kernel_table.py);
- `llm.embedding(W, ids)` becomes `ort.cast(llm.embedding(W_d, ids), f32)`: rows gathered from
  the 16-bit table and widened (exact), so no f32 copy of the table is held.

A weight that stays f32 is matmul'd by onnxruntime's FusedMatMul (MLAS, which repacks it when
the session opens: load time and a heap copy), unless `f32_kernel` asks for llmir's custom op:
`ort.fused_matmul(x, W)` with transB becomes `ort.matmul_f32(x, W) {layout = L}` (ai.llmir
MatMulF32: the f32 weight read as stored, no repacking), with the same `auto`/`custom` rules as
`kernel` (`auto` is the default: `llmir build --f32-matmul llmir`); `f32_kernel = "ort"` keeps
FusedMatMul (`--f32-matmul mlas`). The layout L is how the artifact stores W:
"panel16" (`f32_layout`'s default: [ceil(N/16), K, 16], the GEMM's packed layout, written once
by the serializer) when every use of W is such a matmul, else "rows" (W as is: a table tied to
the embedding, whose Gather reads rows, is stored once); `f32_layout = "rows"` keeps rows
everywhere.

First of all (option `swiglu`, on by default, the build option of the same name), each gated
MLP that lower-ort-matmul expanded, core.mul(ort.quick_gelu(x @ Wg^T), x @ Wu^T), whose gate and
up matmuls would both run on llmir's kernel in one width (their weights static, used nowhere
else, the same --dtype or stored width) becomes that kernel over `core.concat(Wg, Wu, axis 0)`
with `epilogue = "swiglu"` (silu(gate) * up computed in the kernel, half as wide): `ort.matmul16`
of the stored 16-bit concatenation, or `ort.matmul_f32 {layout = "panel16"}` when H (the rows
of each) is a multiple of 16, so that gate panel p and up panel p + H/16 hold the same output
columns. One op and one weight stream instead of two matmuls, QuickGelu and Mul; the report
says `matmul-swiglu`. `f32_kernel = "ort"` (--f32-matmul mlas), `f32_layout = "rows"`,
`kernel = "f32"` or a machine without the library keep the op-by-op MLP.

MatMulNBits weights (`--quant`, GGUF blocks) are not touched. The report gives each weight's max
rounding error and which path it took (and why the custom op was not used).

Invariant: only static weights change, each by the d rounding of its values (exact for a weight
stored in d already); `ort.matmul16` computes what `ort.fused_matmul` of the widened weight does
(f32 accumulation). Validation is differential at the pass's declared tolerance
(`validation_rtol`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, TensorType, numpy_dtype
from llmir_core.passes.base import PassContext, erase_dead, scratch_builder, take_over
from llmir_core.targets.onnxruntime.dialect import PANEL_ROWS
from llmir_core.targets.onnxruntime.lower_common import Graph, declare_ort, is_decoder, tt
from llmir_core.targets.onnxruntime.native.cpu import CPU, llmir_kernels, no_kernels

WEIGHT_DTYPES = ("f16", "bf16")
KERNELS = ("auto", "custom", "f32")
F32_KERNELS = ("ort", "auto", "custom")  # f32 weights: FusedMatMul, or llmir's MatMulF32
F32_KERNEL = "auto"  # the default: panels read in place for cpu=x86-64-v3 (docs/perf.md)
F32_LAYOUTS = ("panel16", "rows")  # ort.matmul_f32's stored layout: panels where possible, or rows


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


def _gated(g: Graph, op: Op) -> tuple[Value, Value, Value, list[Op]] | None:
    """(x, Wg, Wu, the four ops) when op is core.mul(ort.quick_gelu(x @ Wg^T) {alpha = 1},
    x @ Wu^T) (either operand order) over ort.fused_matmul (transB) by static 2-D f32 weights of
    one shape, each intermediate value and each weight used only there; else None."""
    if op.name != "core.mul" or len(op.operands) != 2:
        return None
    for a, u in (op.operands, op.operands[::-1]):
        act = g.producer(a, "ort.quick_gelu")
        up = g.producer(u, "ort.fused_matmul")
        gate = g.producer(act.operands[0], "ort.fused_matmul") if act is not None else None
        if act is None or up is None or gate is None or act.attrs.get("alpha", 1.0) != 1.0:
            continue
        if not (g.only_use(a, op) and g.only_use(u, op) and g.only_use(act.operands[0], act)):
            continue
        (x, wg), (xu, wu) = gate.operands[:2], up.operands[:2]
        if (
            len(gate.operands) != 2
            or len(up.operands) != 2
            or x is not xu
            or wg is wu
            or not (gate.attrs.get("transB") and up.attrs.get("transB"))
        ):
            continue
        ok = all(
            id(w) in g.static
            and isinstance(w.type, TensorType)
            and w.type.dtype == DType.f32
            and w.type.rank == 2
            and g.only_use(w, mm)
            and (w.owner is None or w.owner.name != "ort.cast")
            for w, mm in ((wg, gate), (wu, up))
        )
        if ok and tt(wg).shape == tt(wu).shape and tt(x).dtype == DType.f32 and tt(x).rank >= 2:
            return x, wg, wu, [op, act, gate, up]
    return None


@dataclass(frozen=True)
class LowerOrtWeightDtype:
    name: ClassVar[str] = "lower-ort-weight-dtype"
    summary: ClassVar[str] = (
        "decoder matmul weights and embedding table stored in f16/bf16, widened at load"
    )
    dtype: str = ""  # f16 | bf16 | f32 ("": each weight in the width its source stores)
    kernel: str = "auto"  # auto | custom | f32: the matmul path for 16-bit weights (see above)
    f32_kernel: str = F32_KERNEL  # ort | auto | custom: the matmul path for f32 weights
    f32_layout: str = F32_LAYOUTS[0]  # panel16 | rows: ort.matmul_f32's weight layout (above)
    swiglu: bool = True  # gated MLPs: one matmul over [gate; up] with the SwiGLU epilogue (above)
    cpu: str = CPU  # x86-64-v3: llmir's kernels (auto, custom); x86-64: onnxruntime's ops only
    # --verify-each compares outputs differentially at this relative tolerance (bf16 rounds each
    # weight by up to 2^-9 of its magnitude; f16 by 2^-12), scaled by depth
    validation_rtol: ClassVar[float] = 2e-2

    def run(self, module: Module, ctx: PassContext) -> bool:
        d = parse_weight_dtype(self.dtype)
        keep = self.dtype == ""  # the default: 16-bit stored weights stay 16-bit
        self._check_options()
        f32_custom = self.f32_kernel != "ort"
        if (d is None and not keep and not f32_custom) or not is_decoder(module):
            return False
        from llmir_core.passes.static_eval import static_value

        why: list[str | None] = []  # the custom op's unavailability, decided at the first use
        here: list[str | None] = []  # the same for ort.matmul_f32 (f32_kernel = auto)

        def custom() -> str | None:
            if not why:
                why.append(self._custom())
            return why[0]

        def custom_f32() -> bool:
            if self.f32_kernel == "custom":
                return True
            if not here:
                here.append(self._unavailable())
            return here[0] is None

        changed = False
        for fn in module.functions:
            stored: dict[int, Value] = {}  # weight -> its d value
            if self.swiglu:

                def store(w: Value, wd: DType, fn: Function = fn) -> Value:
                    return self._store(fn, w, wd, ctx, module, static_value)

                changed |= self._fuse_gated(fn, ctx, d, keep, custom, custom_f32, store)
            g = Graph(fn)
            wide: dict[int, Value] = {}  # weight -> ort.cast(d value, f32)
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
                wd = d if d is not None else (_stored_16(w) if keep else None)
                if wd is None:
                    if (
                        f32_custom
                        and op.name == "ort.fused_matmul"
                        and op.attrs.get("transB")
                        and custom_f32()
                    ):
                        self._matmul_f32(fn, op, w, ctx, self._layout(g, w))
                        changed = True
                    continue
                if id(w) not in stored:
                    stored[id(w)] = self._store(fn, w, wd, ctx, module, static_value)
                w16 = stored[id(w)]
                changed = True
                if op.name == "ort.fused_matmul" and op.attrs.get("transB") and custom() is None:
                    self._matmul16(fn, op, w16, ctx)
                    continue
                if op.name == "llm.embedding":
                    self._embedding(fn, op, w16, ctx)
                    continue
                if id(w) not in wide:
                    wide[id(w)] = self._widen(fn, w16, ctx, custom())
                op.operands[slot] = wide[id(w)]
        if changed:
            declare_ort(module)
        return changed

    def _check_options(self) -> None:
        if self.f32_kernel not in F32_KERNELS:
            raise InputError(
                f"unknown f32_kernel '{self.f32_kernel}' for lower-ort-weight-dtype",
                hint=f"use one of: {', '.join(F32_KERNELS)}",
            )
        if self.f32_layout not in F32_LAYOUTS:
            raise InputError(
                f"unknown f32_layout '{self.f32_layout}' for lower-ort-weight-dtype",
                hint=f"use one of: {', '.join(F32_LAYOUTS)}",
            )
        if self.f32_kernel == "custom" and not llmir_kernels(self.cpu):
            raise no_kernels("lower-ort-weight-dtype f32_kernel=custom", self.cpu)

    def _fuse_gated(
        self,
        fn: Function,
        ctx: PassContext,
        d: DType | None,
        keep: bool,
        custom: Callable[[], str | None],
        custom_f32: Callable[[], bool],
        store: Callable[[Value, DType], Value],
    ) -> bool:
        """Each expanded gated MLP, core.mul(ort.quick_gelu(x @ Wg^T), x @ Wu^T) over two
        ort.fused_matmul (transB) by static f32 weights that have no other use, whose matmuls
        would both run on llmir's kernel in the same width, becomes that kernel over
        concat(Wg, Wu) with `epilogue = "swiglu"`: ort.matmul_f32 (panel16, H a multiple of 16)
        or ort.matmul16 of the stored 16-bit concatenation."""
        g = Graph(fn)
        changed = False
        for op in list(fn.ops):
            m = _gated(g, op)
            if m is None:
                continue
            x, wg, wu, dead = m
            dts = {d if d is not None else (_stored_16(w) if keep else None) for w in (wg, wu)}
            h = tt(wg).shape[0]
            if len(dts) != 1 or not isinstance(h, int):
                continue  # gate and up stored in different widths: op by op
            wd = dts.pop()
            b, new_ops = scratch_builder(fn, op.origin)
            w = b.op("core.concat", wg, wu, axis=0)
            labels = f"{_label(wg)}, {_label(wu)}"
            if wd is None:
                if (
                    self.f32_kernel == "ort"
                    or self.f32_layout != "panel16"
                    or h % PANEL_ROWS
                    or not custom_f32()
                ):
                    continue
                y = b.op("ort.matmul_f32", x, w, layout="panel16", epilogue="swiglu")
                how = f"f32 in 16-row panels of [gate; up] (H = {h}, a multiple of 16)"
                self._insert_before(fn, op, new_ops)
            else:
                if custom() is not None:
                    continue
                self._insert_before(fn, op, new_ops)
                w16 = store(w, wd)
                b, new_ops = scratch_builder(fn, op.origin)
                y = b.op("ort.matmul16", x, w16, epilogue="swiglu")
                how = f"{wd} [gate; up] read as stored, widened in registers"
                self._insert_before(fn, op, new_ops)
            take_over(fn, op.results[0], y)
            erase_dead(fn, dead)
            ctx.applied(
                "matmul-swiglu",
                y,
                f"{labels}: one matmul over [gate; up] with the SwiGLU epilogue on llmir's "
                f"kernel ({how}; silu(gate) * up computed as the columns finish)",
            )
            changed = True
        return changed

    @staticmethod
    def _insert_before(fn: Function, op: Op, new_ops: list[Op]) -> None:
        i = next(i for i, o in enumerate(fn.ops) if o is op)
        fn.ops[i:i] = new_ops

    def _custom(self) -> str | None:
        """None when ort.matmul16 is used, else why not."""
        if self.kernel not in KERNELS:
            raise InputError(
                f"unknown kernel '{self.kernel}' for lower-ort-weight-dtype",
                hint=f"use one of: {', '.join(KERNELS)}",
            )
        if self.kernel == "f32":
            return "the f32 path was asked for (kernel=f32)"
        if self.kernel == "custom" and not llmir_kernels(self.cpu):
            raise no_kernels("lower-ort-weight-dtype kernel=custom", self.cpu)
        return self._unavailable()

    def _unavailable(self) -> str | None:
        """Why this build does not use llmir's kernels (its cpu option), or None: the runtime
        checks that the machine has them when the artifact opens."""
        if llmir_kernels(self.cpu):
            return None
        return f"cpu={self.cpu} asks for onnxruntime's portable ops only"

    def _store(
        self, fn: Function, w: Value, d: DType, ctx: PassContext, module: Module, sv
    ) -> Value:  # type: ignore[no-untyped-def]
        """W in d: its own d tensor when it is a widened one, else core.cast(W, d)."""
        src = w.owner
        if src is not None and src.name == "core.cast" and tt(src.operands[0]).dtype == d:
            ctx.applied("weight-dtype", w, f"{_label(w)}: stored in {d} already (exact)")
            return src.operands[0]  # already stored in d: keep its bytes
        b, new_ops = scratch_builder(fn, src.origin if src is not None else None)
        stored = b.op("core.cast", w, to=d)
        arr = sv(module, w)
        err = (
            float(np.abs(arr.astype(numpy_dtype(d)).astype(np.float32) - arr).max())
            if arr is not None and arr.size
            else float("nan")
        )
        self._insert_after(fn, src, new_ops)
        ctx.applied(
            "weight-dtype", stored, f"{_label(w)}: stored in {d} (max abs rounding error {err:.3g})"
        )
        return stored

    def _insert_after(self, fn: Function, src: Op | None, new_ops: list[Op]) -> None:
        i = next(i for i, o in enumerate(fn.ops) if o is src) + 1 if src is not None else 0
        fn.ops[i:i] = new_ops

    def _widen(self, fn: Function, w16: Value, ctx: PassContext, why: str | None) -> Value:
        src = w16.owner
        b, new_ops = scratch_builder(fn, src.origin if src is not None else None)
        wide = b.op("ort.cast", w16, to=DType.f32)
        self._insert_after(fn, src, new_ops)
        reason = (
            why or "the matmul is not a transB projection"
        ) + "; onnxruntime's CPU provider has no 16-bit GEMM here, so the matmul computes in f32"
        ctx.applied("weight-dtype", wide, f"{_label(w16)}: widened to f32 at load ({reason})")
        return wide

    def _embedding(self, fn: Function, op: Op, w16: Value, ctx: PassContext) -> None:
        """Rows gathered from the 16-bit table, then widened: no f32 copy of the table."""
        b, new_ops = scratch_builder(fn, op.origin)
        rows = b.op("llm.embedding", w16, *op.operands[1:], **dict(op.attrs))
        y = b.op("ort.cast", rows, to=DType.f32)
        i = next(i for i, o in enumerate(fn.ops) if o is op)
        fn.ops[i:i] = new_ops
        take_over(fn, op.results[0], y)
        erase_dead(fn, [op])
        ctx.applied(
            "weight-dtype",
            y,
            f"{_label(w16)}: rows gathered from the {tt(w16).dtype} table, widened to f32 "
            "(exact: no f32 copy of the table)",
        )

    def _matmul16(self, fn: Function, op: Op, w16: Value, ctx: PassContext) -> None:
        self._custom_matmul(
            fn,
            op,
            "ort.matmul16",
            w16,
            ctx,
            f"{_label(w16)}: read as stored by llmir's custom op (ai.llmir, AVX2/F16C), "
            "widened in registers, f32 accumulation",
        )

    def _layout(self, g: Graph, w: Value) -> str:
        """panel16 when every use of w is a transB matmul by it (all become ort.matmul_f32),
        else rows (a tied embedding table: one stored copy that its Gather can read)."""
        if self.f32_layout == "rows" or id(w) in g.outputs:
            return "rows"
        for u in g.uses(w):
            if u.name != "ort.fused_matmul" or not u.attrs.get("transB") or u.operands[0] is w:
                return "rows"
        return "panel16"

    def _matmul_f32(self, fn: Function, op: Op, w: Value, ctx: PassContext, layout: str) -> None:
        how = (
            "stored in 16-row panels (the GEMM's layout, no packing per call)"
            if layout == "panel16"
            else "stored as rows (shared with a reader that needs them)"
            if self.f32_layout == "panel16"
            else "stored as rows (f32_layout=rows)"
        )
        self._custom_matmul(
            fn,
            op,
            "ort.matmul_f32",
            w,
            ctx,
            f"{_label(w)}: f32, read in place by llmir's custom op (ai.llmir MatMulF32), {how}: "
            "no repacked copy when the session loads",
            layout=layout,
        )

    @staticmethod
    def _custom_matmul(
        fn: Function, op: Op, name: str, w: Value, ctx: PassContext, note: str, **attrs: str
    ) -> None:
        """Replace `op` (x @ W^T) by llmir's custom matmul `name` over the weight w."""
        b, new_ops = scratch_builder(fn, op.origin)
        y = b.op(name, op.operands[0], w, **attrs)
        i = next(i for i, o in enumerate(fn.ops) if o is op)
        fn.ops[i:i] = new_ops
        take_over(fn, op.results[0], y)
        erase_dead(fn, [op])
        ctx.applied("weight-dtype", y, note)


__all__ = [
    "F32_KERNEL",
    "F32_KERNELS",
    "F32_LAYOUTS",
    "KERNELS",
    "LowerOrtWeightDtype",
    "WEIGHT_DTYPES",
    "parse_weight_dtype",
]
