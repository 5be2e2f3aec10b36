"""fuse-silu-mul: silu(gate) * up becomes llm.silu_mul(gate, up).

Rewrite: the `fuse-silu-mul` rule set of the rule library (each rule proved by `llmir verify --rules`).
Invariant: same shapes (no broadcast), same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class FuseSiluMul:
    name: ClassVar[str] = "fuse-silu-mul"
    summary: ClassVar[str] = "silu(gate) * up -> llm.silu_mul"

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name))
