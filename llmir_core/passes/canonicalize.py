"""canonicalize: algebraic identities (x+0, x*1, -(-x), same-dtype casts, cancelling transposes).

Rewrite: every rule in the `canonicalize` set of the rule library, to a fixed point.
Invariant: each value keeps its type and its exact floating-point value (all rules are `exact`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class Canonicalize:
    name: ClassVar[str] = "canonicalize"
    summary: ClassVar[str] = (
        "algebraic identities: x+0, x*1, -(-x), no-op casts, cancelling transposes"
    )

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name))
