"""lift-rotary: the half-split rotary embedding of exported graphs becomes
`llm.rotary_embedding`.

Rewrite: `x * C + concat(-x[..., d/2:], x[..., :d/2]) * S`, with C and S the cos and sin tables
gathered by position ids and unsqueezed over heads (HF's rotate_half) -> `llm.rotary_embedding(x,
cos[:, :d/2], sin[:, :d/2], positions)`, by the proved rules lift-rotary-* (any operand order).
Data precondition, checked here on the tables' values (weights, constants, or computed from
them at compile time): each table's second half repeats its first half, as HF builds them
(cat(freqs, freqs)). A table known only at run time is not lifted.
Invariant: the result keeps its type and (over the reals) its value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from llmir_core.ir.core import Module
from llmir_core.rewrite.fusion_rules import tables_repeat_halves
from llmir_core.rewrite.library import rules_for
from llmir_core.rewrite.rule import Rule
from llmir_core.rewrite.terms import Match

from .base import PassContext
from .rewriting import apply_rules
from .static_eval import static_value


def _with_table_check(r: Rule, module: Module) -> Rule:
    structural = r.check

    def check(m: Match) -> str | None:
        reason = structural(m) if structural is not None else None
        if reason is not None:
            return reason
        for key in ("cos", "sin"):
            tab: Any = static_value(module, m.values[key])
            if tab is None:
                return f"the {key} table %{m.values[key].name} is known only at run time"
            if not tables_repeat_halves(tab):
                return f"the {key} table's second half does not repeat its first half"
        return None

    return dataclasses.replace(r, check=check)


@dataclass(frozen=True)
class LiftRotary:
    name: ClassVar[str] = "lift-rotary"
    summary: ClassVar[str] = "x*cos + rotate_half(x)*sin (HF half-split) -> llm.rotary_embedding"

    def run(self, module: Module, ctx: PassContext) -> bool:
        rules = [_with_table_check(r, module) for r in rules_for(self.name)]
        # the gathered tables are shared by the q and k rotaries of a layer
        return apply_rules(
            module,
            ctx,
            rules,
            exclusive=True,
            may_share=frozenset({"core.gather", "core.unsqueeze"}),
        )
