"""fuse-add-rms-norm: a residual add feeding an RMSNorm becomes one `llm.add_rms_norm`, whose two
results are the normalized value and the sum (the residual stream the next layer adds to).

Rewrite: `s = x + r; y = rms_norm(s, w)` -> `y, s = llm.add_rms_norm(x, r, w)`; it applies the
proved rules fuse-add-rms-norm (y) and fuse-add-rms-norm-sum (s) and logs both.
Invariant: y and s keep their values and types; x and r have one shape (no broadcasting); every
other use of s still sees the sum, now the fused op's second result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmir_core.ir.core import Function, Module, Op
from llmir_core.ir.types import TensorType
from llmir_core.rewrite.library import RULES, is_proved
from llmir_core.rewrite.rule import RuleInstance, value_loc

from .base import PassContext, erase_dead, replace_uses, scratch_builder

RULE_NAMES = ("fuse-add-rms-norm", "fuse-add-rms-norm-sum")


def _reason(norm: Op, pos: dict[int, int], fn: Function) -> str | None:
    add = norm.operands[0].owner
    if add is None or add.name != "core.add":
        return "the normalized value is not a residual add"
    x, r = add.operands
    if not isinstance(x.type, TensorType) or x.type != r.type or x.type != norm.results[0].type:
        return f"the add broadcasts ({x.type} + {r.type})"
    w = norm.operands[1]
    at = max(pos[id(add)], pos[id(w.owner)] if w.owner is not None else -1) + 1
    early = [o for o in fn.ops[pos[id(add)] + 1:at] if any(v is add.results[0] for v in o.operands)]
    if early:
        return f"the sum is used by {early[0].name} before the norm weight %{w.name} is defined"
    return None


@dataclass(frozen=True)
class FuseAddRmsNorm:
    name: ClassVar[str] = "fuse-add-rms-norm"
    summary: ClassVar[str] = "residual add + rms_norm -> llm.add_rms_norm (normed, sum)"

    def run(self, module: Module, ctx: PassContext) -> bool:
        if not ctx.allow_unproved and not all(is_proved(RULES[n]) for n in RULE_NAMES):
            return False
        changed = False
        for fn in module.functions:
            for norm in [o for o in fn.ops if o.name == "llm.rms_norm"]:
                pos = {id(o): i for i, o in enumerate(fn.ops)}
                reason = _reason(norm, pos, fn)
                if reason is None:
                    self._rewrite(fn, ctx, norm, pos)
                    changed = True
                elif norm.operands[0].owner is not None and norm.operands[0].owner.name == "core.add":
                    ctx.rejected(RULE_NAMES[0], norm.results[0], reason)
        return changed

    def _rewrite(self, fn: Function, ctx: PassContext, norm: Op, pos: dict[int, int]) -> None:
        add = norm.operands[0].owner
        assert add is not None
        x, r = add.operands
        w = norm.operands[1]
        at = max(pos[id(add)], pos[id(w.owner)] if w.owner is not None else -1) + 1
        b, new_ops = scratch_builder(fn, norm.origin)
        attrs: dict[str, Any] = {k: norm.attrs[k] for k in ("eps", "offset") if k in norm.attrs}
        fused = b.create("llm.add_rms_norm", [x, r, w], attrs)
        fn.ops[at:at] = new_ops
        full = {"eps": norm.attrs.get("eps", 1e-6), "offset": norm.attrs.get("offset", 0.0)}
        for rule, old, new in ((RULE_NAMES[0], norm.results[0], fused.results[0]),
                               (RULE_NAMES[1], add.results[0], fused.results[1])):
            loc = value_loc(old)
            ctx.applied(rule, old, RULES[rule].summary)
            replace_uses(fn, old, new)
            name = old.name
            old.name = name + ".dead"
            new.name = name
            ctx.instances.append(RuleInstance(rule, name, name, {"x": x.name, "r": r.name, "w": w.name},
                                              {}, dict(full), loc))
        erase_dead(fn, [norm, add])
