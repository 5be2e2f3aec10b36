"""lift-rms-norm: decomposed RMSNorm (pow/mul, reduce_mean over the last axis, + eps, rsqrt or 1/sqrt, * weight) becomes llm.rms_norm.

Rewrite: the `lift-rms-norm` rule set of the rule library (each rule proved by `llmir verify --rules`).
Invariant: the result equals the decomposed form over the reals (reassociation aside: rsqrt vs 1/sqrt); eps > 0 is required.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class LiftRmsNorm:
    name: ClassVar[str] = "lift-rms-norm"
    summary: ClassVar[str] = "decomposed RMSNorm -> llm.rms_norm"

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name))
