"""lift-layer-norm: the decomposed LayerNorm of exported graphs becomes `llm.layer_norm`.

Rewrite: `c = x - reduce_mean(x, -1); (c / sqrt(reduce_mean(c^2, -1) + eps)) * w (+ b)` (also
with c*c, rsqrt, and w on the left) -> `llm.layer_norm(x, w[, b]){eps}`, by the proved rules
lift-layer-norm-*; only over the last axis, with eps > 0 and w, b vectors over that axis.
Invariant: the result keeps its type and (over the reals) its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class LiftLayerNorm:
    name: ClassVar[str] = "lift-layer-norm"
    summary: ClassVar[str] = "decomposed (x - mean) / sqrt(var + eps) * w + b -> llm.layer_norm"

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name), exclusive=True)
