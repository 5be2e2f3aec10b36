"""lift-attention: exported attention becomes `llm.scaled_dot_product_attention`.

Rewrite, by the proved rules lift-attention-*, attention-gqa* and attention-causal-mask:
- `softmax(q @ k^T * s (+ mask), -1) @ v` (scores scaled by a positive constant s or divided by
  c; k transposed by an op or by transpose_b; mask an additive float tensor) -> `sdpa(q, k, v
  [, mask]){scale}`;
- k and v repeated g times per head by unsqueeze(2) + tile + reshape (repeat_interleave) ->
  grouped-query attention over the un-repeated k and v;
- the additive mask `trilu(constant_of_shape(-inf), 1)` over [seq, seq] when q and k have that
  same length -> `causal = true` (no mask tensor).
Invariant: the attention output keeps its type and (over the reals) its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.library import rules_for

from .base import PassContext
from .rewriting import apply_rules


@dataclass(frozen=True)
class LiftAttention:
    name: ClassVar[str] = "lift-attention"
    summary: ClassVar[str] = (
        "softmax(q k^T * scale + mask) v -> llm.scaled_dot_product_attention (GQA, causal)"
    )

    def run(self, module: Module, ctx: PassContext) -> bool:
        return apply_rules(module, ctx, rules_for(self.name), exclusive=True)
