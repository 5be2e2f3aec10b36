"""fuse-linear: a matmul followed by a bias add and/or an activation becomes one `llm.linear`.

Rewrite: `act(x @ w + b)`, `x @ w + b` and `act(x @ w)` (w as [out, in] with transpose_b, or
[in, out]; act one of silu, relu, gelu, gelu_tanh) -> `llm.linear(x, w[, b]){activation}`, by
the proved rules linear-* (a bare matmul is left alone). Only when the intermediate values are
used nowhere else.
Invariant: the result keeps its type; over the reals its value (the fused op rounds once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class FuseLinear:
    name: ClassVar[str] = "fuse-linear"
    summary: ClassVar[str] = "matmul + bias + activation -> llm.linear"

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name), exclusive=True)
