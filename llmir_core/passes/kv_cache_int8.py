"""kv-cache-int8: the KV cache entries of a decoder (the `past_key_values.{l}.key/.value`
arguments and the `present` values concatenated from them) are quantized to int8 with one f32
scale per batch row, head and position (over the head_dim channels).

Rewrite (default, `interface=false`): each new block `new` [B, H, S, D] appended to a cache entry,
`concat(past, new, axis=2)`, becomes `concat(past, f32(q) * s)` with `s = max|new| / 127` over D
(1 for an all-zero row) and the int8 codes `q = i8(round(new / s))`, by the approximate rule
kv-cache-int8. The signature is unchanged (the runtime keeps f32 tensors; the codes and scales
are explicit values a backend stores instead), so translation validation applies.
With `interface=true` the cache itself becomes int8: each cache argument turns into its codes
(i8, same shape) followed by a new argument `<name>_scale` (f32 [B, H, past, 1]), and each
present output into its codes followed by its scales, in the same order, so the decoder runtime
(which reads the cache specs from the signature and feeds presents back as pasts) runs it
unchanged; attention reads the dequantized concatenation. The signature differs, so this mode
is checked by running the decoder, not by translation validation.
With `scales=calibrated` the cache becomes int8 with static scales (what onnxruntime's
GroupQueryAttention stores in its shared past/present buffer): one f32 scale per KV head and
channel (`granularity=channel`, [1, kv_heads, 1, head_dim]) or one per cache entry
(`granularity=tensor`, [1]), s = margin * amax / 127, where amax is the largest |value| the f32
module writes into that entry while the reference interpreter runs a calibration prompt (a
built-in text through the module's tokenizer, built-in ids without one, or the prompts of
`calibration=FILE`, one per line). The scales are constants `%kv_scale.{l}.key/.value`; the
module attribute `llm.kv_cache_int8` records where they came from. Each cache argument and
present output turns into int8 codes (no scale arguments); a new block is stored as
`i8(clamp(round(new * (1/s)), -128, 127))` and attention reads `f32(codes) * s`. Values beyond
the calibrated range saturate, so no error-bound lemma covers the rewrite: it is validated
differentially (`verify --against` adapts the f32 cache inputs to the int8 ones).
The report gives the KV memory per token before and after.
Invariant: every cache element the attention reads is within scale/2 of the f32 value (the
proved lemma; calibrated: unless it saturates); no element is quantized twice (past blocks keep
their codes and scales).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from llmir_core.errors import InputError
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, TensorType
from llmir_core.rewrite.library import RULES, is_proved
from llmir_core.rewrite.quant_rules import (
    KV_CODE_MAX,
    kv_codes,
    kv_codes_static,
    kv_dequant,
    kv_scale,
)
from llmir_core.rewrite.terms import Match, V, build

from .base import PassContext, erase_dead, replace_uses, scratch_builder
from .kv_calibration import calibrate
from .rewriting import Part, rewrite

RULE = "kv-cache-int8"
RULE_CALIBRATED = "kv-cache-int8-calibrated"  # a rewrite (report) name, validated differentially
CACHE_ARG = re.compile(r"^past_key_values\.\d+\.(key|value)$")


def cache_entries(fn: Function) -> list[tuple[Value, Op]]:
    """(cache argument, the concat that appends the new block to it) of a decoder function."""
    out = []
    for a in fn.args:
        if not CACHE_ARG.match(a.name) or not isinstance(a.type, TensorType) or a.type.rank != 4:
            continue
        cat = next(
            (
                op
                for op in fn.ops
                if op.name == "core.concat"
                and len(op.operands) == 2
                and op.operands[0] is a
                and op.attrs.get("axis") in (2, -2)
            ),
            None,
        )
        if cat is not None:
            out.append((a, cat))
    return out


def kv_bytes_per_token(fn: Function, int8: bool, scale_per_position: bool = True) -> int:
    """Bytes one position of every cache entry takes (batch 1): H*D*itemsize, or H*D (+ 4*H
    for the per-position scales)."""
    total = 0
    for a, _ in cache_entries(fn):
        t = a.type
        assert isinstance(t, TensorType)
        h, d = t.shape[1], t.shape[3]
        if not isinstance(h, int) or not isinstance(d, int):
            continue
        if int8:
            total += h * d + (4 * h if scale_per_position else 0)
        else:
            total += h * d * (t.dtype.bits // 8)  # type: ignore[union-attr]
    return total


SCALES = ("per-position", "calibrated")
GRANULARITY = ("channel", "tensor")


@dataclass(frozen=True)
class KvCacheInt8:
    name: ClassVar[str] = "kv-cache-int8"
    summary: ClassVar[str] = (
        "int8 KV cache entries: one scale per head and position, or calibrated static scales"
    )
    interface: bool = False  # true: the cache arguments and outputs themselves become int8 + scales
    scales: str = "per-position"  # or "calibrated": static scales, int8 cache in the signature
    granularity: str = "channel"  # calibrated: one scale per head and channel, or per entry
    calibration: str = ""  # calibrated: a file of prompts (one per line); "" = built in
    margin: float = 1.0  # calibrated: scale = margin * amax / 127

    def __post_init__(self) -> None:
        where = "kv-cache-int8"
        if self.scales not in SCALES:
            raise InputError(
                f"{where}{{scales}}: expected one of {', '.join(SCALES)}, got {self.scales!r}"
            )
        if self.granularity not in GRANULARITY:
            raise InputError(
                f"{where}{{granularity}}: expected one of {', '.join(GRANULARITY)}, "
                f"got {self.granularity!r}"
            )
        calibrated = self.scales == "calibrated"
        if not calibrated and (
            self.calibration or self.granularity != "channel" or self.margin != 1.0
        ):
            raise InputError(
                f"{where}: calibration, granularity and margin apply to scales=calibrated only",
                hint="write kv-cache-int8{scales=calibrated,calibration=prompts.txt}",
            )
        if calibrated and self.interface:
            raise InputError(
                f"{where}: scales=calibrated always makes the cache int8 in the signature; "
                "drop interface=true"
            )
        if not (0.0 < self.margin <= 16.0) or not math.isfinite(self.margin):
            raise InputError(f"{where}{{margin}}: expected a number in (0, 16], got {self.margin}")

    def run(self, module: Module, ctx: PassContext) -> bool:
        if self.scales == "calibrated":
            return self._run_calibrated(module, ctx)
        if not ctx.allow_unproved and not is_proved(RULES[RULE]):
            return False
        changed = False
        for fn in module.functions:
            entries = cache_entries(fn)
            if not entries:
                continue
            before = kv_bytes_per_token(fn, False)
            for arg, cat in entries:
                reason = self._reason(arg, cat)
                if reason is not None:
                    ctx.rejected(RULE, cat.results[0], reason)
                    continue
                if self.interface:
                    self._int8_interface(fn, arg, cat)
                elif not self._roundtrip(fn, cat, ctx):
                    continue
                changed = True
            if changed:
                after = kv_bytes_per_token(fn, True)
                ctx.applied(
                    RULE,
                    fn.args[2] if self.interface else entries[0][0],
                    f"KV cache of @{fn.name}: {before} -> {after} bytes per token "
                    f"({100 * (1 - after / before):.1f}% less; {len(entries)} entries, "
                    f"{'int8 in the signature' if self.interface else 'int8 codes in the IR'})",
                )
        return changed

    def _run_calibrated(self, module: Module, ctx: PassContext) -> bool:
        if not module.functions:
            return False
        fn = module.main
        entries = cache_entries(fn)
        if entries and [a.name for a in fn.args[:2]] != ["input_ids", "positions"]:
            for _, cat in entries:  # calibration runs the module as a decoder
                ctx.rejected(
                    RULE_CALIBRATED,
                    cat.results[0],
                    "calibration needs a decoder (inputs input_ids, positions, then the caches)",
                )
            return False
        ok = []
        for arg, cat in entries:
            reason = self._reason(arg, cat)
            if reason is None and list(fn.outputs).count(cat.results[0]) != 1:
                reason = "the cache entry is not returned once as a present output"
            if reason is not None:
                ctx.rejected(RULE_CALIBRATED, cat.results[0], reason)
                continue
            ok.append((arg, cat))
        if not ok:
            return False
        before = kv_bytes_per_token(fn, False)
        cal = calibrate(module, [cat.results[0] for _, cat in ok], self.calibration)
        for arg, cat in ok:
            amax = cal.amax[cat.results[0].name]
            if self.granularity == "tensor":
                amax = np.asarray([amax.max()])
            scale = np.where(amax > 0, self.margin * amax / KV_CODE_MAX, 1.0).astype(np.float32)
            if self.granularity == "channel":
                scale = scale.reshape(1, amax.shape[0], 1, amax.shape[1])
            present = self._int8_static(fn, arg, cat, scale)
            ctx.applied(
                RULE_CALIBRATED,
                present,
                f"int8 %{arg.name} with {scale.size} static scale(s) "
                f"(max {float(scale.max()):.4g}, calibrated amax {float(amax.max()):.4g})",
            )
        after = kv_bytes_per_token(fn, True, scale_per_position=False)
        module.attrs["llm.kv_cache_int8"] = {
            "scales": "calibrated",
            "granularity": self.granularity,
            "margin": self.margin,
            "calibration": cal.source,
            "prompts": cal.prompts,
            "tokens": cal.tokens,
            "method": "amax of the f32 module's cache entries (reference interpreter) / 127",
            "sample_ids": cal.sample,
        }
        ctx.applied(
            RULE_CALIBRATED,
            fn.args[2],
            f"KV cache of @{fn.name}: {before} -> {after} bytes per token "
            f"({100 * (1 - after / before):.1f}% less; {len(ok)} entries, int8 in the signature, "
            f"static per-{self.granularity} scales from {cal.tokens} tokens of {cal.source}; "
            "validated differentially)",
        )
        return True

    def _int8_static(self, fn: Function, arg: Value, cat: Op, scale: np.ndarray) -> Value:
        """Rewrite one cache entry; return its new present (the int8 codes)."""
        t = arg.type
        assert isinstance(t, TensorType)
        codes_arg = Value(arg.name, t.with_dtype(DType.i8))
        fn.args[fn.args.index(arg)] = codes_arg
        new = cat.operands[1]
        old = cat.results[0]
        name = old.name
        old.name += ".dead"  # the codes take the present's name
        b, new_ops = scratch_builder(fn, cat.origin)
        s = b.create(
            "core.constant",
            [],
            {"value": DenseAttr(scale)},
            names=["kv_scale." + arg.name.removeprefix("past_key_values.")],
        ).results[0]
        work = b.op("core.cast", new, to=DType.f32) if t.dtype != DType.f32 else new
        m = Match(values={"new": work, "s": s})
        codes = build(kv_codes_static(V("new"), V("s")), m, b)
        all_codes = b.create("core.concat", [codes_arg, codes], {"axis": 2}, names=[name]).results[
            0
        ]
        m.values["q"] = all_codes
        deq = build(kv_dequant(V("q"), V("s")), m, b)
        if t.dtype != DType.f32:
            deq = b.op("core.cast", deq, to=t.dtype)
        at = fn.ops.index(cat)
        fn.ops[at:at] = new_ops
        fn.outputs = [all_codes if v is old else v for v in fn.outputs]
        replace_uses(fn, old, deq)  # the attention reads the dequantized entry
        erase_dead(fn, [cat])
        return all_codes

    def _reason(self, arg: Value, cat: Op) -> str | None:
        t, new = arg.type, cat.operands[1].type
        if not isinstance(t, TensorType) or t.dtype not in (DType.f32, DType.f16, DType.bf16):
            return f"cache entry %{arg.name} is not a float tensor"
        if not isinstance(new, TensorType) or new.dtype != t.dtype or new.rank != 4:
            return "the appended block is not [batch, heads, seq, head_dim] of the cache's dtype"
        return None

    def _roundtrip(self, fn: Function, cat: Op, ctx: PassContext) -> bool:
        detail = (
            f"int8 codes and per-position scales of the block appended to %{cat.operands[0].name}"
        )
        return rewrite(fn, ctx, [Part(RULES[RULE], cat.results[0], detail=detail)]) is None

    def _int8_interface(self, fn: Function, arg: Value, cat: Op) -> None:
        t = arg.type
        assert isinstance(t, TensorType)
        codes_arg = Value(arg.name, t.with_dtype(DType.i8))
        scale_arg = Value(arg.name + "_scale", TensorType((*t.shape[:3], 1), DType.f32))
        i = fn.args.index(arg)
        fn.args[i : i + 1] = [codes_arg, scale_arg]
        new = cat.operands[1]
        b, new_ops = scratch_builder(fn, cat.origin)
        work = b.op("core.cast", new, to=DType.f32) if t.dtype != DType.f32 else new
        m = Match(values={"new": work})
        scale = build(kv_scale(V("new")), m, b)
        m.values["s"] = scale
        codes = build(kv_codes(V("new"), V("s")), m, b)
        all_codes = b.create(
            "core.concat", [codes_arg, codes], {"axis": 2}, names=[cat.results[0].name]
        ).results[0]
        all_scales = b.create(
            "core.concat", [scale_arg, scale], {"axis": 2}, names=[cat.results[0].name + "_scale"]
        ).results[0]
        m.values.update(q=all_codes, s=all_scales)
        deq = build(kv_dequant(V("q"), V("s")), m, b)
        if t.dtype != DType.f32:
            deq = b.op("core.cast", deq, to=t.dtype)
        at = fn.ops.index(cat)
        fn.ops[at:at] = new_ops
        old = cat.results[0]
        old.name += ".dead"
        outs: list[Value] = []
        for v in fn.outputs:
            outs += [all_codes, all_scales] if v is old else [v]
        fn.outputs = outs
        replace_uses(fn, old, deq)  # the attention reads the dequantized entry
        erase_dead(fn, [cat])
