"""fuse-add-rms-norm: a residual add feeding an RMSNorm becomes one `llm.add_rms_norm`, whose two
results are the normalized value and the sum (the residual stream the next layer adds to).

Rewrite: `s = x + r; y = rms_norm(s, w)` -> `y, s = llm.add_rms_norm(x, r, w)`; it applies the
proved rules fuse-add-rms-norm (y) and fuse-add-rms-norm-sum (s) as one rewrite of the engine
(the norm weight, when defined between the add and the norm, is hoisted above the add).
Invariant: y and s keep their values and types; x and r have one shape (no broadcasting); every
other use of s still sees the sum, now the fused op's second result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module, Op
from llmir_core.ir.types import TensorType
from llmir_core.rewrite.library import RULES

from .base import PassContext
from .rewriting import Part, rewrite

RULE_NAMES = ("fuse-add-rms-norm", "fuse-add-rms-norm-sum")


def _reason(norm: Op) -> str | None:
    add = norm.operands[0].owner
    assert add is not None
    x, r = add.operands
    if not isinstance(x.type, TensorType) or x.type != r.type or x.type != norm.results[0].type:
        return f"the add broadcasts ({x.type} + {r.type})"
    return None


@dataclass(frozen=True)
class FuseAddRmsNorm:
    name: ClassVar[str] = "fuse-add-rms-norm"
    summary: ClassVar[str] = "residual add + rms_norm -> llm.add_rms_norm (normed, sum)"

    def run(self, module: Module, ctx: PassContext) -> bool:
        changed = False
        for fn in module.functions:
            for norm in [o for o in fn.ops if o.name == "llm.rms_norm"]:
                add = norm.operands[0].owner
                if add is None or add.name != "core.add":
                    continue
                reason = _reason(norm)
                if reason is not None:
                    ctx.rejected(RULE_NAMES[0], norm.results[0], reason)
                    continue
                parts = [
                    Part(RULES[RULE_NAMES[0]], norm.results[0]),
                    Part(RULES[RULE_NAMES[1]], add.results[0]),
                ]
                changed |= rewrite(fn, ctx, parts) is None
        return changed
