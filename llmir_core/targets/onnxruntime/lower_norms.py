"""lower-ort-norms: RMS norms become onnxruntime's fused norm ops.

Rewrites (f32, weight static): `llm.rms_norm(core.add(a, b), w)` whose sum has no use before the
norm -> `ort.skip_simplified_layer_norm(a, b, w)` (the sum is its second result, so the residual
stream continues from it); `llm.add_rms_norm` -> the same op; any other `llm.rms_norm` ->
`ort.simplified_layer_norm`. eps and offset carry over (the serializer folds offset into the
scale).

Each op records the kernel that runs it (option `norm_kernel`, opt-in): `kernel = "llmir"` is
llmir's own AVX2 norm from its onnxruntime custom-op library (ai.llmir
SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization: the same node interface,
llmir_core/targets/onnxruntime/native/norm.c), taken when `norm_kernel` is `llmir`, or `auto` and the
the build's `cpu` option is x86-64-v3 (the default); with `onnxruntime` (the default) the attribute is absent:
com.microsoft's ops. One node runs 128 rows ~2.9x faster than onnxruntime's; whole prefills
moved by less than this machine's run-to-run spread (docs/perf.md), so it stays opt-in.

Invariant: each op's decomposition is the replaced `core.add` + `llm.rms_norm` with the same
attributes (exact: translation validation meets the original terms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Op
from llmir_core.ir.types import DType
from llmir_core.passes.base import PassContext, erase_dead, scratch_builder, take_over
from llmir_core.targets.onnxruntime.lower_common import Graph, declare_ort, is_decoder, tt
from llmir_core.targets.onnxruntime.native.cpu import CPU, llmir_kernels, no_kernels

NORM_KERNEL = ("onnxruntime", "auto", "llmir")  # the first is the default


@dataclass(frozen=True)
class LowerOrtNorms:
    name: ClassVar[str] = "lower-ort-norms"
    summary: ClassVar[str] = (
        "rms_norm (+ residual add) -> ort.simplified_layer_norm / skip_simplified_layer_norm"
    )
    norm_kernel: str = NORM_KERNEL[0]
    cpu: str = CPU  # x86-64-v3: llmir's kernel may run the norms; x86-64: onnxruntime's ops

    def run(self, module: Module, ctx: PassContext) -> bool:
        if self.norm_kernel not in NORM_KERNEL:
            raise InputError(
                f"unknown norm_kernel '{self.norm_kernel}'",
                hint=f"use one of: {', '.join(NORM_KERNEL)}",
            )
        if self.norm_kernel == "llmir" and not llmir_kernels(self.cpu):
            raise no_kernels("norm_kernel=llmir", self.cpu)
        if not is_decoder(module):  # other modules keep the generic op-by-op build
            return False
        changed = False
        for fn in module.functions:
            for op in [o for o in fn.ops if o.name in ("llm.rms_norm", "llm.add_rms_norm")]:
                if self._lower(fn, Graph(fn), op, ctx):
                    changed = True
        if changed:
            declare_ort(module)
        return changed

    def _lower(self, fn: Function, g: Graph, op: Op, ctx: PassContext) -> bool:
        x, w = op.operands[0], op.operands[-1]
        if tt(x).dtype != DType.f32 or id(w) not in g.static:
            ctx.rejected(self.name, op.results[0], "not f32 or its weight is not constant")
            return False
        attrs: dict[str, object] = {
            "epsilon": float(op.attrs.get("eps", 1e-6)),
            "offset": float(op.attrs.get("offset", 0.0)),
        }
        if self._llmir():
            attrs["kernel"] = "llmir"
        b, new_ops = scratch_builder(fn, op.origin)
        pos = g.index[id(op)]
        dead = [op]
        if op.name == "llm.add_rms_norm":
            new = b.create("ort.skip_simplified_layer_norm", list(op.operands), attrs)
            pairs = list(zip(op.results, new.results))
            rule = "skip-simplified-layer-norm"
        else:
            add = g.producer(x, "core.add")
            fusable = (
                add is not None
                and tt(add.operands[0]).shape == tt(x).shape
                and tt(add.operands[1]).shape == tt(x).shape
                and tt(add.operands[0]).dtype == DType.f32
                and not any(g.index[id(u)] < pos for u in g.uses(x) if u is not op)
            )
            if add is not None and fusable:
                new = b.create(
                    "ort.skip_simplified_layer_norm", [add.operands[0], add.operands[1], w], attrs
                )
                pairs = [(op.results[0], new.results[0]), (x, new.results[1])]
                dead.append(add)
                rule = "skip-simplified-layer-norm"
            else:
                new = b.create("ort.simplified_layer_norm", [x, w], attrs)
                pairs = [(op.results[0], new.results[0])]
                rule = "simplified-layer-norm"
        fn.ops[pos:pos] = new_ops
        for old_v, new_v in pairs:
            take_over(fn, old_v, new_v)
        erase_dead(fn, dead)
        ctx.applied(rule, new.results[0], "llmir's kernel" if "kernel" in attrs else "")
        return True

    def _llmir(self) -> bool:
        """Whether the norms run on llmir's kernel: asked for (llmir or auto) in a build for a
        cpu that has llmir's kernels (the runtime checks the machine when the artifact opens)."""
        return self.norm_kernel != "onnxruntime" and llmir_kernels(self.cpu)
