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

The rewrites are a conversion-pattern table (`LowerOrtNorms.table`: source op, target op, the
function that gives the attributes or the reason it does not apply) run by the rewrite engine
(`passes/rewriting.py:apply_conversions`) with the onnxruntime target's capabilities as the legal
set; each conversion is logged as a rule instance named after its row
(`lower-ort-norms.skip_simplified_layer_norm`).

Invariant: each op's decomposition is the replaced `core.add` + `llm.rms_norm` with the same
attributes (exact: translation validation meets the original terms).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType
from llmir_core.passes.base import PassContext
from llmir_core.passes.rewriting import Conversion, Converted, apply_conversions
from llmir_core.targets.onnxruntime.lower_common import declare_ort, is_decoder, legal, tt
from llmir_core.targets.onnxruntime.native.cpu import CPU, llmir_kernels, no_kernels

NORM_KERNEL = ("onnxruntime", "auto", "llmir")  # the first is the default
SKIP = "ort.skip_simplified_layer_norm"
PLAIN = "ort.simplified_layer_norm"

Convert = Callable[[Function, Op], Converted | str]
Attrs = Callable[[Op], dict[str, object]]


def _static(v: Value) -> bool:
    """Whether `v` is computed from weights and constants only."""
    op = v.owner
    if op is None:
        return False
    if op.name in ("core.weight", "core.constant"):
        return True
    return bool(op.operands) and all(_static(u) for u in op.operands)


def _unfit(op: Op) -> str | None:
    x, w = op.operands[0], op.operands[-1]
    if tt(x).dtype != DType.f32 or not _static(w):
        return "not f32 or its weight is not constant"
    return None


def _used_before(fn: Function, v: Value, op: Op) -> bool:
    """Whether an op before `op` (other than it) uses `v`."""
    for o in fn.ops:
        if o is op:
            return False
        if any(u is v for u in o.operands):
            return True
    return False


def _fused(attrs: Attrs) -> Convert:
    """`llm.rms_norm(core.add(a, b), w)` -> skip norm of (a, b, w), whose second result is the sum."""

    def convert(fn: Function, op: Op) -> Converted | str:
        x, w = op.operands[0], op.operands[-1]
        add = x.owner if x.owner is not None and x.owner.name == "core.add" else None
        if add is None:
            return "its input is not a core.add"
        a, b = add.operands
        if tt(a).shape != tt(x).shape or tt(b).shape != tt(x).shape or tt(a).dtype != DType.f32:
            return "the add broadcasts or is not f32"
        if _used_before(fn, x, op):
            return "the sum is used before the norm"
        return _unfit(op) or Converted(attrs(op), [a, b, w], also=(x,))

    return convert


def _same(attrs: Attrs) -> Convert:
    """The op with its own operands and results (add_rms_norm's are the skip norm's)."""

    def convert(fn: Function, op: Op) -> Converted | str:
        return _unfit(op) or Converted(attrs(op))

    return convert


def _row(source: str, target: str, convert: Convert) -> Conversion:
    return Conversion(f"lower-ort-norms.{target.removeprefix('ort.')}", source, target, convert)


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
        changed = apply_conversions(module, ctx, self.table(), legal)
        if changed:
            declare_ort(module)
        return changed

    def table(self) -> tuple[Conversion, ...]:
        """The conversion-pattern table, with this pass's kernel choice in its rows' attributes."""
        kernel: dict[str, object] = {"kernel": "llmir"} if self._llmir() else {}

        def attrs(op: Op) -> dict[str, object]:
            return {
                "epsilon": float(op.attrs.get("eps", 1e-6)),
                "offset": float(op.attrs.get("offset", 0.0)),
                **kernel,
            }

        return (
            _row("llm.add_rms_norm", SKIP, _same(attrs)),
            _row("llm.rms_norm", SKIP, _fused(attrs)),
            _row("llm.rms_norm", PLAIN, _same(attrs)),
        )

    def _llmir(self) -> bool:
        """Whether the norms run on llmir's kernel: asked for (llmir or auto) in a build for a
        cpu that has llmir's kernels (the runtime checks the machine when the artifact opens)."""
        return self.norm_kernel != "onnxruntime" and llmir_kernels(self.cpu)
