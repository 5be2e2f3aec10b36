"""lower-ort-matmul: projections by constant weights become onnxruntime's matmul ops.

First the composite ops over constant weights are expanded through their own definitions
(`llm.gated_mlp`, `llm.linear`, `llm.silu_mul`, `llm.quantized_matmul`: exact). Then each
`core.matmul(x, W)` of an f32 activation by a static 2-D weight (or a row-concatenation of
weights, the packed QKV) becomes:

- `ort.matmul_gguf` when W is a GGUF tensor in any other format than q4_0/q8_0 (q4_1, q5_0,
  q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs): its blocks are read in place by llmir's
  kernel (ai.llmir MatMulGGUF), exact, no requantization ("kept exactly" in the report). A
  row-concatenation of such tensors of one format is one op (its rows, concatenated); a gated
  MLP whose gate and up share one such format takes the SwiGLU epilogue (below), one whose gate
  and up differ stays op by op. Only when asked (`quant` int4/int8, or option `gguf_kernels =
  requant`), or where llmir's custom ops do not build here or an accuracy_level below 4 asks
  for f32 activations (then q6_k/q3_k take MatMulNBits' exact blocks of 16, the others
  `ort.fused_matmul` over the exactly dequantized weight), do they take the forms below;
- `ort.matmul_nbits` when W is stored in blocks: GGUF q4_0/q8_0 (and with gguf_kernels =
  requant q5_0 to int8 blocks, q6_k/q3_k to blocks of 16) and nbits weights are repacked losslessly (`quantize =
  "none"`), GGUF q4_1/q5_1/q2_k/q4_k/q5_k/iq4_nl/iq4_xs are requantized when asked to blocks
  with zero points (the report gives the max error), and f32 weights are quantized when `quant`
  is int4/int8 (`quantize = "sym"`). Packed checkpoint weights (GPTQ,
  AWQ, compressed-tensors) repack losslessly when they have 4 or 8 bits, power-of-two groups
  of consecutive columns and zero points that fit; otherwise (act-order g_idx, 2 bits, other
  group sizes) they are requantized with zero points and the report gives the reason and the
  max error;
- `ort.matmul_s8` instead when `quant` is int8, `int8_matmul` is `llmir` (the default) and W is
  an f32 (or f16/bf16) weight with no other use, in a build for cpu=x86-64-v3 (the default):
  llmir's own kernel (ai.llmir MatMulS8) reads int8 weights per output
  channel in place (no prepacking at load) and rounds activations per 32 columns at run time.
  With cpu=x86-64, int8 blocks (`ort.matmul_nbits`, onnxruntime's MatMulNBits:
  activations rounded per block at accuracy_level 4) instead, and the report says why: QGEMM's
  per-tensor activations lose far more on real models (docs/real-weights.md);
- `ort.dynamic_quantize_matmul` when `int8_matmul` is `qgemm-s8pair` or `qgemm-u8`:
  int8 weights per output channel and activations quantized per tensor at
  run time (MLAS QGEMM; the op's `weights` attribute says how the codes are stored,
  llmir_core/quant/qgemm.py). A weight tied to the embedding stays `ort.matmul_nbits` (the
  lookup shares its blocks); `int8_matmul = nbits` keeps every int8 weight in blocks. See
  docs/perf.md for the measurements;
- `ort.fused_matmul` otherwise.

Each `ort.matmul_nbits` records the kernel that runs it (`nbits_kernel`): `kernel = "llmir"` is
llmir's own block-quantized matmul from its onnxruntime custom-op library (ai.llmir
MatMulNBitsQ4/Q8: the stored blocks read in place, no prepacked copy; int8 activations as
accuracy_level 4, see the op's doc), taken for block_size 32 at accuracy_level 4 when
`nbits_kernel` is `auto` (the default) or `llmir` and the build's `cpu` option is x86-64-v3 (the
default; cpu=x86-64 refuses `llmir`); otherwise the attribute is absent: onnxruntime's MatMulNBits (MLAS).

Weights this build quantizes (`quantize` sym/asym) for llmir's kernel get f16 block scales
(`scale_dtype = "f16"`: each scale rounded to f16, the codes computed with it, as GGUF's q4_0
stores them) unless `nbits_scales` is f32; a tied embedding lookup takes the same blocks.

MatMulNBits' `accuracy_level` (the activation precision onnxruntime may use) is the pass option
(default ACCURACY_LEVEL = 4, int8 activations: measured fastest on AVX2 and AVX-512 VNNI, see
docs/perf.md), except that an `llm.quantized_matmul` carrying its own level (an imported ONNX
MatMulNBits) keeps it.

First of all (option `swiglu`, on by default), each `llm.gated_mlp` (silu) whose gate and up
projections would both run on llmir's kernel (`ort.matmul_nbits {kernel = "llmir"}`,
`ort.matmul_s8`, or `ort.matmul_gguf` for gate and up of one GGUF format) becomes that op over `core.concat(w_gate, w_up, axis 0)` with
`epilogue = "swiglu"` (silu(gate) * up computed in the kernel, half as wide), then the down
projection: one op and one weight stream instead of two matmuls, ort.quick_gelu and core.mul.
Blocks and per-row scales of the concatenation are those of each weight, so the fused module
computes what the op-by-op one does. MLAS (MatMulNBits / QGEMM) keeps the op-by-op MLP. f32 and
16-bit MLPs are expanded here and fused by lower-ort-weight-dtype (which picks their kernel).

`core.silu` of f32 becomes `ort.quick_gelu` (alpha 1). Invariant: every exact op's
decomposition is the op it replaced. A requantizing `ort.matmul_nbits` (`quantize` sym/asym)
means `llm.quantize` of its weight then `llm.quantized_matmul`: each one that replaces a matmul
(or, with the SwiGLU epilogue and its down projection, a gated MLP) of the module as it was is
logged as an instance of the approximate rule `nbits-int{4,8}-{sym,asym}-{matmul,swiglu}`
(llmir_core/rewrite/nbits_rules.py), so translation validation reaches its verdict on terms.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import numpy as np

from llmir_core.dialects.registry import get_op
from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType
from llmir_core.passes.base import PassContext, erase_dead, scratch_builder, take_over
from llmir_core.quant.gguf_repack import LOSSLESS
from llmir_core.rewrite.nbits_rules import rule_name
from llmir_core.rewrite.rule import RuleInstance, value_loc
from llmir_core.targets.onnxruntime.lower_common import (
    ACCURACY_LEVEL,
    GGUF_KERNEL,
    Evaluate,
    Graph,
    NbitsFormat,
    WSrc,
    check_accuracy_level,
    check_gguf_kernels,
    declare_ort,
    gguf_exact_format,
    is_decoder,
    nbits_format,
    packed_lossless,
    packed_parts,
    packed_requant_reason,
    parse_quant,
    quantize_mode,
    static_evaluator,
    tt,
    weight_src,
    weight_srcs,
)
from llmir_core.targets.onnxruntime.native.cpu import CPU, llmir_kernels, no_kernels

_EXPAND = ("llm.gated_mlp", "llm.linear", "llm.silu_mul", "llm.quantized_matmul")
INT8_MATMUL = ("llmir", "qgemm-s8pair", "qgemm-u8", "nbits")  # the first is the default
NBITS_KERNEL = ("auto", "llmir", "mlas")  # the first is the default
NBITS_SCALES = ("f16", "f32")  # block scales of weights llmir quantizes for its kernel
_FLOAT_SRC = ("f32", "cast", "eval")


@dataclass(frozen=True)
class LowerOrtMatmul:
    name: ClassVar[str] = "lower-ort-matmul"
    summary: ClassVar[str] = (
        "matmuls by constant weights -> ort.matmul_gguf (GGUF blocks in place) / ort.matmul_nbits "
        "(GGUF repack, int4/int8) / ort.fused_matmul"
    )
    quant: str = ""
    quant_block: int = 32
    accuracy_level: int = ACCURACY_LEVEL
    int8_matmul: str = INT8_MATMUL[0]
    nbits_kernel: str = NBITS_KERNEL[0]
    swiglu: bool = True
    nbits_scales: str = NBITS_SCALES[0]
    gguf_kernels: str = GGUF_KERNEL
    cpu: str = CPU  # x86-64-v3: llmir's kernels where they apply; x86-64: onnxruntime's ops

    def run(self, module: Module, ctx: PassContext) -> bool:
        if not is_decoder(module):  # other modules keep the generic op-by-op build
            return False
        fmt = parse_quant(self.quant, self.quant_block)
        check_accuracy_level(self.accuracy_level)
        check_int8_matmul(self.int8_matmul)
        check_nbits_kernel(self.nbits_kernel)
        if self.nbits_kernel == "llmir" and not llmir_kernels(self.cpu):
            raise no_kernels("nbits_kernel=llmir", self.cpu)
        check_gguf_kernels(self.gguf_kernels)
        if self.nbits_scales not in NBITS_SCALES:
            raise InputError(
                f"unknown nbits_scales '{self.nbits_scales}'",
                hint=f"use one of: {', '.join(NBITS_SCALES)}",
            )
        base = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
        changed = False
        ev = static_evaluator(module)
        s8_why = partial(_s8_unavailable, self.cpu)
        for fn in module.functions:
            levels: dict[int, int] = {}  # core.matmul op id -> its quantized_matmul's level
            # which matmuls a requantizing op logs a rule instance for (see _log_requant)
            log = _Log({id(o) for o in fn.ops}, {id(v) for v in fn.values()})
            if self.swiglu:
                changed |= self._fuse_gated(fn, ctx, fmt, base, ev, s8_why, log)
            changed |= self._expand(fn, levels, log)
            g = Graph(fn)
            for op in list(fn.ops):
                if op.name == "core.matmul":
                    level = levels.get(id(op), self.accuracy_level)
                    changed |= self._matmul(fn, g, op, ctx, fmt, base, ev, level, s8_why, log)
                elif op.name == "core.silu" and tt(op.operands[0]).dtype == DType.f32:
                    b, new_ops = scratch_builder(fn, op.origin)
                    y = b.op("ort.quick_gelu", op.operands[0], alpha=1.0)
                    self._splice(fn, op, new_ops, [y])
                    changed = True
        if changed:
            declare_ort(module)
        return changed

    def _kernel(self, bits: int, block: int, level: int) -> str | None:
        """`llmir` when ort.matmul_nbits runs on llmir's kernel, else None (MatMulNBits)."""
        if self.nbits_kernel == "mlas" or block != 32 or bits not in (4, 8) or level != 4:
            return None
        # auto or llmir: the cpu option decides (run refused llmir on x86-64); the runtime
        # checks that the machine has the kernels when the artifact opens
        return "llmir" if llmir_kernels(self.cpu) else None

    def _scales(self, mode: str, kernel: str | None) -> dict[str, str]:
        """`scale_dtype = "f16"` for weights this build quantizes for llmir's kernel (which
        reads f16 scales as stored) when `nbits_scales` is f16 (the default): 2 bytes a block
        instead of 4 (int4: ~10% fewer bytes a weight)."""
        if mode == "none" or kernel != "llmir" or self.nbits_scales != "f16":
            return {}
        return {"scale_dtype": "f16"}

    def _splice(self, fn: Function, op: Op, new_ops: list[Op], results: list) -> None:  # type: ignore[type-arg]
        i = next(i for i, o in enumerate(fn.ops) if o is op)
        fn.ops[i:i] = new_ops
        for old, new in zip(op.results, results):
            take_over(fn, old, new)
        erase_dead(fn, [op])

    def _expand(self, fn: Function, levels: dict[int, int], log: _Log) -> bool:
        g = Graph(fn)
        changed = False
        for op in list(fn.ops):
            if op.name not in _EXPAND or tt(op.operands[0]).dtype != DType.f32:
                continue
            weights = op.operands[1:] if op.name != "llm.silu_mul" else []
            if any(id(w) not in g.static for w in weights):
                continue
            od = get_op(op.name)
            assert od is not None and od.decompose is not None
            b, new_ops = scratch_builder(fn, op.origin)
            outs = od.decompose(b, list(op.operands), od.with_defaults(op.attrs))
            level = int(op.attrs.get("accuracy_level", -1))
            if op.name == "llm.quantized_matmul" and level >= 0:  # kept from an imported node
                levels.update({id(o): level for o in new_ops if o.name == "core.matmul"})
            last = outs[0].owner if len(outs) == 1 else None
            if (
                last is not None
                and last.name == "core.matmul"
                and last.operands[0] is op.operands[0]
            ):
                log.whole.add(id(last))  # the op's own definition is this matmul of its x
            if op.name == "llm.gated_mlp" and last is not None and id(op.operands[0]) in log.values:
                mms = [o for o in new_ops if o.name == "core.matmul"]
                if len(mms) == 3 and mms[2] is last:
                    x, wg, wu, wd = op.operands
                    act = str(op.attrs.get("activation", "silu"))
                    log.mlp[id(last)] = (op.results[0].name, x, wg, wu, wd, act, mms[0], mms[1])
            self._splice(fn, op, new_ops, outs)
            changed = True
        return changed

    def _fuse_gated(
        self,
        fn: Function,
        ctx: PassContext,
        fmt: NbitsFormat | None,
        base: str,
        ev: Evaluate,
        s8_why: Callable[[], str | None],
        log: _Log,
    ) -> bool:
        """Each llm.gated_mlp (silu) whose gate and up projections would both run on llmir's
        kernel (ort.matmul_nbits {kernel = "llmir"} or ort.matmul_s8) becomes that op over
        concat(w_gate, w_up) with `epilogue = "swiglu"`, then core.matmul by w_down."""
        g = Graph(fn)
        changed = False
        for op in list(fn.ops):
            if op.name != "llm.gated_mlp" or op.attrs.get("activation", "silu") != "silu":
                continue
            x, wg, wu, wd = op.operands
            if tt(x).dtype != DType.f32 or tt(x).rank < 2 or id(wd) not in g.static:
                continue
            parts = [weight_src(g, wg), weight_src(g, wu)]
            if parts[0] is None or parts[1] is None or parts[0].cols != parts[1].cols:
                continue
            srcs = [p for p in parts if p is not None]
            b, new_ops = scratch_builder(fn, op.origin)
            w = b.op("core.concat", wg, wu, axis=0)
            h = self._fused(b, g, op, x, w, srcs, ctx, fmt, base, ev, s8_why)
            if h is None:
                continue
            y = b.op("core.matmul", h, wd, transpose_b=True)
            if h.owner is not None and h.owner.name == "ort.matmul_nbits" and id(x) in log.values:
                log.gated[id(y.owner)] = (op.results[0].name, x, wg, wu, wd, h.owner)
            self._splice(fn, op, new_ops, [y])
            changed = True
        return changed

    def _fused(
        self,
        b: Any,
        g: Graph,
        op: Op,
        x: Value,
        w: Value,
        srcs: list[WSrc],
        ctx: PassContext,
        fmt: NbitsFormat | None,
        base: str,
        ev: Evaluate,
        s8_why: Callable[[], str | None],
    ) -> Value | None:
        """The gate/up matmul with the SwiGLU epilogue on llmir's kernel, or None (then the
        gated MLP is expanded and lowered op by op)."""
        labels = ", ".join(s.label for s in srcs)
        exact = {gguf_exact_format(s, fmt, self.gguf_kernels) for s in srcs}
        if exact != {None}:  # GGUF blocks read in place: one MatMulGGUF of one format, or none
            if len(exact) != 1 or self.accuracy_level != 4 or s8_why() is not None:
                return None
            gf = str(exact.pop())
            y = b.op("ort.matmul_gguf", x, w, format=gf, epilogue="swiglu")
            ctx.applied(
                "matmul-swiglu",
                y,
                "; ".join(
                    f"{s.label}: {gf} kept exactly (GGUF blocks read in place by llmir's kernel)"
                    for s in srcs
                )
                + "; one matmul over [gate; up] with the SwiGLU epilogue on llmir's kernel",
            )
            return y
        if (
            fmt is not None and fmt.bits == 8 and not fmt.asym and self.int8_matmul != "nbits"
        ):  # int8: ort.matmul_s8 or nothing (QGEMM keeps the op-by-op form)
            if (
                self.int8_matmul != "llmir"
                or not all(s.kind in _FLOAT_SRC for s in srcs)
                or not all(g.only_use(s.value, op) for s in srcs)
                or s8_why() is not None
            ):
                return None
            y = b.op("ort.matmul_s8", x, w, epilogue="swiglu")
            ctx.applied(
                "matmul-swiglu",
                y,
                f"{labels}: one int8 matmul over [gate; up] with the SwiGLU epilogue "
                "(llmir's kernel: silu(gate) * up computed as the rows finish)",
            )
            return y
        fmts = {nbits_format(s, fmt, ev) for s in srcs}
        nb = fmts.pop() if len(fmts) == 1 else None
        if nb is None or srcs[0].cols % nb.block != 0:
            return None
        kernel = self._kernel(nb.bits, nb.block, self.accuracy_level)
        if kernel != "llmir":
            return None
        modes = {quantize_mode(s, nb, ev) for s in srcs}
        mode = "none" if modes == {"none"} else ("asym" if nb.asym else "sym")
        y = b.op(
            "ort.matmul_nbits",
            x,
            w,
            bits=nb.bits,
            block_size=nb.block,
            accuracy_level=self.accuracy_level,
            quantize=mode,
            kernel=kernel,
            epilogue="swiglu",
            **self._scales(mode, kernel),
        )
        how = "; ".join(self._describe(s, nb, base, ev) for s in srcs)
        ctx.applied(
            "matmul-swiglu",
            y,
            how + "; one matmul over [gate; up] with the SwiGLU epilogue on llmir's kernel",
        )
        return y

    def _matmul(
        self,
        fn: Function,
        g: Graph,
        op: Op,
        ctx: PassContext,
        fmt: NbitsFormat | None,
        base: str,
        ev: Evaluate,
        level: int,
        s8_why: Callable[[], str | None],
        log: _Log,
    ) -> bool:
        # long: one decision ladder per matmul (GGUF as stored, s8, nbits, the f32 fallback), in the order the kernels are preferred
        x, w = op.operands
        if op.attrs.get("transpose_a") or tt(x).dtype != DType.f32 or tt(x).rank < 2:
            return False
        srcs = weight_srcs(g, w)
        if srcs is None:
            return False
        trans_b = bool(op.attrs.get("transpose_b"))
        b, new_ops = scratch_builder(fn, op.origin)
        if any(gguf_exact_format(s, fmt, self.gguf_kernels) for s in srcs) and not (
            level != 4 and all(s.scheme in LOSSLESS for s in srcs)
        ):  # (f32 activations: q6_k/q3_k take MatMulNBits' exact blocks of 16, below)
            y = self._gguf(b, x, w, srcs, trans_b, ctx, s8_why, level)
            self._splice(fn, op, new_ops, [y])
            return True
        if (
            fmt is not None
            and fmt.bits == 8
            and not fmt.asym
            and self.int8_matmul != "nbits"
            and trans_b
            and all(s.kind in _FLOAT_SRC for s in srcs)
            and g.only_use(w, op)
        ):
            labels = ", ".join(s.label for s in srcs)
            if self.int8_matmul == "llmir" and s8_why() is None:
                y = b.op("ort.matmul_s8", x, w)
                ctx.applied(
                    "matmul-s8",
                    y,
                    f"{labels}: f32 quantized to int8 per output channel, read in place by "
                    "llmir's kernel (activations rounded per 32 columns at run time)",
                )
                self._splice(fn, op, new_ops, [y])
                return True
            if self.int8_matmul != "llmir":  # QGEMM only when asked (llmir: int8 blocks below)
                kind = self.int8_matmul.split("-", 1)[1]
                y = b.op("ort.dynamic_quantize_matmul", x, w, weights=kind)
                ctx.applied(
                    "dynamic-quantize-matmul",
                    y,
                    "; ".join(
                        f"{s.label}: f32 quantized to int8 per output channel ({kind}), "
                        "activations to uint8 per tensor at run time"
                        for s in srcs
                    ),
                )
                self._splice(fn, op, new_ops, [y])
                return True
        fmts = {nbits_format(s, fmt, ev) for s in srcs} if trans_b else {None}
        nb = fmts.pop() if len(fmts) == 1 else None
        if nb is not None and srcs[0].cols % nb.block == 0:
            modes = {quantize_mode(s, nb, ev) for s in srcs}
            mode = "none" if modes == {"none"} else ("asym" if nb.asym else "sym")
            kernel = self._kernel(nb.bits, nb.block, level)
            y = b.op(
                "ort.matmul_nbits",
                x,
                w,
                bits=nb.bits,
                block_size=nb.block,
                accuracy_level=level,
                quantize=mode,
                **({"kernel": kernel} if kernel else {}),
                **self._scales(mode, kernel),
            )
            how = "; ".join(self._describe(s, nb, base, ev) for s in srcs)
            if _s8_fallback(self.int8_matmul, fmt, srcs) and (why := s8_why()):
                how += f" (int8_matmul=llmir: {why}; blocks, not per-tensor QGEMM activations)"
            ctx.applied("matmul-nbits", y, how + ("; llmir's kernel" if kernel else ""))
            if y.owner is not None and mode != "none":
                _log_requant(ctx, op, y.owner, log)
        else:
            y = b.op("ort.fused_matmul", x, w, transB=trans_b)
        self._splice(fn, op, new_ops, [y])
        return True

    def _gguf(
        self,
        b: Any,
        x: Value,
        w: Value,
        srcs: list[WSrc],
        trans_b: bool,
        ctx: PassContext,
        s8_why: Callable[[], str | None],
        level: int,
    ) -> Value:
        """x @ w^T over GGUF blocks read in place (`ort.matmul_gguf`): one format for the whole
        weight (a row-concatenation of tensors of one format is their rows, concatenated). Where
        that cannot be (another format in the concatenation, a weight not transposed, f32
        activations asked for by an accuracy_level below 4 (MatMulGGUF rounds decode rows to
        int8), or llmir's custom ops do not build here), `ort.fused_matmul` over the exactly
        dequantized f32 weight."""
        labels = ", ".join(s.label for s in srcs)
        schemes = {s.scheme for s in srcs}
        why = None
        if level != 4:
            why = f"accuracy_level {level} asks for f32 activations"
        elif not trans_b:
            why = "the weight is not used transposed"
        elif len(schemes) != 1 or any(s.kind != "gguf" for s in srcs):
            why = "a row-concatenation of weights in different formats"
        else:
            why = s8_why()
        if why is None:
            fmt = str(schemes.pop())
            y = b.op("ort.matmul_gguf", x, w, format=fmt)
            ctx.applied(
                "matmul-gguf",
                y,
                "; ".join(
                    f"{s.label}: {fmt} kept exactly (GGUF blocks read in place by llmir's kernel)"
                    for s in srcs
                ),
            )
            return y
        y = b.op("ort.fused_matmul", x, w, transB=trans_b)
        ctx.applied("fused-matmul", y, f"{labels}: GGUF blocks dequantized exactly to f32 ({why})")
        return y

    def _describe(self, s: WSrc, nb: NbitsFormat, base: str, ev: Evaluate) -> str:
        tag = f"int{nb.bits} block {nb.block}"
        if s.kind == "nbits":
            return f"{s.label}: nbits {tag} passed through"
        if s.kind == "packed" and packed_lossless(s, nb, ev):
            return f"{s.label}: {s.scheme} repacked losslessly to {tag}"
        if s.kind == "packed":
            why = packed_requant_reason(s, ev) or f"the op's format is {tag}"
            return (
                f"{s.label}: {s.scheme} requantized to {tag} with zero points ({why}), "
                f"max abs error {_packed_requant_error(s, nb, base, ev):.3g}"
            )
        if s.kind == "gguf" and quantize_mode(s, nb) == "none":
            return f"{s.label}: {s.scheme} kept exactly (repacked losslessly to {tag})"
        if s.kind == "gguf":
            return (
                f"{s.label}: {s.scheme} requantized to {tag}{' with zero points' * nb.asym}, "
                f"max abs error {_requant_error(s, nb, base):.3g}"
            )
        return f"{s.label}: f32 quantized to {tag} ({'asym' if nb.asym else 'sym'})"


def _requant_error(s: WSrc, nb: NbitsFormat, base: str) -> float:
    """Max |requantized - gguf| over the weight (what the serializer's repacking loses)."""
    from llmir_core.quant import gguf_blocks
    from llmir_core.targets.onnxruntime.dialect import fake_quant
    from llmir_core.weights import load_weight

    assert s.op is not None and s.scheme is not None
    w = load_weight(s.op.attrs, tt(s.op.results[0]), base)
    raw = np.asarray(w.data).reshape(s.rows, -1)
    err = 0.0
    step = max(1, (8 << 20) // max(1, s.cols * 4))
    for r in range(0, s.rows, step):
        x = gguf_blocks.dequantize(raw[r : r + step], s.scheme, (min(step, s.rows - r), s.cols))
        back = fake_quant(x, nb.bits, nb.block, "asym" if nb.asym else "sym")
        err = max(err, float(np.abs(back - x).max()))
    return err


def _packed_requant_error(s: WSrc, nb: NbitsFormat, base: str, ev: Evaluate) -> float:
    """Max |requantized - checkpoint| over a packed weight (what the serializer's requantizing loses)."""
    from llmir_core.quant import int32_packed
    from llmir_core.targets.onnxruntime.dialect import fake_quant
    from llmir_core.weights import load_weight

    assert s.op is not None
    p = packed_parts(s, ev)
    q = p.qtype
    w = load_weight(s.op.attrs, tt(s.op.results[0]), base)
    x = int32_packed.dequantize(
        q.scheme,
        np.asarray(w.data),
        p.scales,
        p.zero_points,
        p.g_idx,
        q.bits,
        q.block,
        (s.rows, s.cols),
    )
    back = fake_quant(x, nb.bits, nb.block, "asym" if nb.asym else "sym")
    return float(np.abs(back - x).max())


def check_nbits_kernel(kind: str) -> None:
    if kind not in NBITS_KERNEL:
        raise InputError(
            f"unknown nbits_kernel '{kind}'", hint=f"use one of: {', '.join(NBITS_KERNEL)}"
        )


def _s8_unavailable(cpu: str) -> str | None:
    """None when a build for cpu may use llmir's kernels (ai.llmir MatMulS8, MatMulGGUF),
    else why not."""
    if llmir_kernels(cpu):
        return None
    return f"cpu={cpu} asks for onnxruntime's portable ops only"


def _s8_fallback(int8_matmul: str, fmt: NbitsFormat | None, srcs: list[WSrc]) -> bool:
    """An int8 matmul of float weights that asked for llmir's MatMulS8 (the default): where the
    library cannot run, it takes int8 blocks (activations rounded per block), not QGEMM (one
    uint8 range per activation tensor: ~60x the KL divergence on Gemma 3 270M,
    docs/real-weights.md)."""
    return (
        fmt is not None
        and fmt.bits == 8
        and not fmt.asym
        and int8_matmul == "llmir"
        and all(s.kind in _FLOAT_SRC for s in srcs)
    )


def check_int8_matmul(kind: str) -> None:
    if kind not in INT8_MATMUL:
        raise InputError(
            f"unknown int8_matmul '{kind}'", hint=f"use one of: {', '.join(INT8_MATMUL)}"
        )


@dataclass
class _Log:
    """What lower-ort-matmul may log a requantizing op's rule instance for: a matmul of the
    module as it was (`ops`, over an operand `values` held), one that is the whole definition of
    an op it expanded (`whole`), or the down projection of a gated MLP it fused (`gated`: the
    MLP's name, x, wg, wu, wd and the gate/up op). Elsewhere the lowered op's operand is not the
    original's, and no instance is logged (validation compares those differentially)."""

    ops: set[int]
    values: set[int]
    whole: set[int] = field(default_factory=set)
    gated: dict[int, tuple[str, Value, Value, Value, Value, Op]] = field(default_factory=dict)
    # a gated MLP expanded op by op: its down matmul -> name, x, wg, wu, wd, activation, gate, up
    mlp: dict[int, tuple[str, Value, Value, Value, Value, str, Op, Op]] = field(
        default_factory=dict
    )
    lowered: dict[int, Op] = field(default_factory=dict)  # matmul -> its requantizing op


def _fmt(op: Op) -> Any:
    from llmir_core.targets.onnxruntime.dialect import nbits_qtype

    at = op.attrs
    return nbits_qtype(
        int(at["bits"]),
        int(at["block_size"]),
        str(at["quantize"]),
        str(at.get("scale_dtype", "f32")),
    )


def _log_requant(ctx: PassContext, mm: Op, nb: Op, log: _Log) -> None:
    """Log the instance of nbits-int{bits}-{sym,asym}-{matmul,swiglu} that `nb` (a requantizing
    ort.matmul_nbits) applies in place of the matmul `mm` (its result's name is the root)."""
    x, w = mm.operands
    root = mm.results[0]
    sym = nb.attrs["quantize"] == "sym"
    log.lowered[id(mm)] = nb
    mlp = log.mlp.get(id(mm))
    if mlp is not None:
        name, mx, wg, wu, wd, act, gate, up = mlp
        parts = [log.lowered.get(id(gate)), log.lowered.get(id(up))]
        if any(
            p is None or p.attrs["quantize"] != nb.attrs["quantize"] or _fmt(p) != _fmt(nb)
            for p in parts
        ):
            return
        ctx.instances.append(
            RuleInstance(
                rule_name(int(nb.attrs["bits"]), sym, f"gated-mlp-{act}"),
                name,
                name,
                {"x": mx.name, "wg": wg.name, "wu": wu.name, "wd": wd.name},
                {},
                {"format": _fmt(nb)},
                value_loc(root),
            )
        )
        return
    gated = log.gated.get(id(mm))
    if gated is not None:
        name, gx, wg, wu, wd, gu = gated
        if gu.attrs.get("quantize") != nb.attrs["quantize"] or _fmt(gu) != _fmt(nb) or wd is not w:
            return
        n = gu.operands[1].type.shape[0]  # type: ignore[union-attr]
        if not isinstance(n, int):  # the epilogue needs a static N (its op verifies so)
            return
        ctx.instances.append(
            RuleInstance(
                rule_name(int(nb.attrs["bits"]), sym, "swiglu"),
                name,
                name,
                {"x": gx.name, "wg": wg.name, "wu": wu.name, "wd": wd.name},
                {},
                {"format": _fmt(nb), "half": (n // 2,), "full": (n,)},
                value_loc(root),
            )
        )
        return
    if id(x) not in log.values or not (id(mm) in log.ops or id(mm) in log.whole):
        return
    ctx.instances.append(
        RuleInstance(
            rule_name(int(nb.attrs["bits"]), sym, "matmul"),
            root.name,
            root.name,
            {"x": x.name, "w": w.name},
            {},
            {"format": _fmt(nb)},
            value_loc(root),
        )
    )
