"""fuse-gated-mlp: down(silu_mul(x @ Wg^T, x @ Wu^T)) becomes llm.gated_mlp (the GEMM+SiLU gated MLP).

Rewrite: the `fuse-gated-mlp` rule set of the rule library (each rule proved by `llmir verify --rules`).
Invariant: same values; weights keep the HF [out, in] layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class FuseGatedMlp:
    name: ClassVar[str] = "fuse-gated-mlp"
    summary: ClassVar[str] = "matmul(silu_mul(matmul, matmul)) -> llm.gated_mlp"

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name))
