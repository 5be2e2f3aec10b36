"""Where each part of an op's meaning comes from: its declaration (`OpDef.smt`, `.interval`,
`.cost`) or a generic fallback.

- smt: `explicit`; `encoder` (the element-level encoder library, `semantics.Encoder` and
  `rewrite.smt_ext.ExtEncoder`); `decomposition` (translation validation expands the op through
  its proved decomposition; rules over it are proved only where the encoder covers it); else
  `uninterpreted` (an uninterpreted function in translation validation: rewrites of it are
  validated by differential testing).
- interval: `explicit`; `generic` (`intervals.INTERVAL_RULES`); else `fallback` ([0, 1] for bool
  results, unbounded otherwise).
- cost: `explicit`; else `generic` (`metrics.generic_flops`, every operand read once).

Imports z3 (through the encoder): call it from checks and tests, not at start-up.
"""

from __future__ import annotations

from llmir_core.dialects.opdef import OpDef


def smt_source(od: OpDef) -> str:
    from .semantics import has_encoding

    if od.smt is not None:
        return "explicit"
    if has_encoding(od.name):
        return "encoder"
    if od.decompose is not None:
        return "decomposition"
    return "uninterpreted"


def interval_source(od: OpDef) -> str:
    from .intervals import interval_rule

    return interval_rule(od.name)[0]


def cost_source(od: OpDef) -> str:
    return "explicit" if od.cost is not None else "generic"


def meaning_of(od: OpDef) -> dict[str, str]:
    return {"smt": smt_source(od), "interval": interval_source(od), "cost": cost_source(od)}
