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
The report gives the KV memory per token before and after.
Invariant: every cache element the attention reads is within scale/2 of the f32 value (the
proved lemma); no element is quantized twice (past blocks keep their codes and scales).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, TensorType
from llmir_core.rewrite.library import RULES, is_proved
from llmir_core.rewrite.quant_rules import kv_codes, kv_dequant, kv_scale
from llmir_core.rewrite.terms import Match, V, build

from .base import PassContext, erase_dead, replace_uses, scratch_builder
from .rewriting import Part, rewrite

RULE = "kv-cache-int8"
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


def kv_bytes_per_token(fn: Function, int8: bool) -> int:
    """Bytes one position of every cache entry takes (batch 1): H*D*itemsize, or H*D + 4*H."""
    total = 0
    for a, _ in cache_entries(fn):
        t = a.type
        assert isinstance(t, TensorType)
        h, d = t.shape[1], t.shape[3]
        if not isinstance(h, int) or not isinstance(d, int):
            continue
        total += h * d + 4 * h if int8 else h * d * (t.dtype.bits // 8)  # type: ignore[union-attr]
    return total


@dataclass(frozen=True)
class KvCacheInt8:
    name: ClassVar[str] = "kv-cache-int8"
    summary: ClassVar[str] = "int8 KV cache entries with one scale per head and position"
    interface: bool = False  # true: the cache arguments and outputs themselves become int8 + scales

    def run(self, module: Module, ctx: PassContext) -> bool:
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
