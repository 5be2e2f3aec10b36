"""fuse-matmul-transpose: a transpose of the last two axes feeding a matmul becomes its transpose_a/transpose_b flag.

Rewrite: the `fuse-matmul-transpose` rule set of the rule library (each rule proved by `llmir verify --rules`).
Invariant: same values; the transpose op disappears when nothing else uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class FuseMatmulTranspose:
    name: ClassVar[str] = "fuse-matmul-transpose"
    summary: ClassVar[str] = "matmul(a, transpose(b)) -> matmul(a, b, transpose_b)"

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name))
