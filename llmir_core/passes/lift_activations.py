"""lift-activations: x * sigmoid(x) becomes core.silu(x).

Rewrite: the `lift-activations` rule set of the rule library (each rule proved by `llmir verify --rules`).
Invariant: values are equal over the reals (exact rules); the result type is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class LiftActivations:
    name: ClassVar[str] = "lift-activations"
    summary: ClassVar[str] = "x * sigmoid(x) -> silu(x)"

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name))
