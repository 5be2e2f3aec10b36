"""Where each part of an op's meaning comes from: its declaration (`OpDef.smt`, `.interval`,
`.cost`) or a generic fallback.

- smt: `explicit` (an element-level encoding), `none` (the declaration says why there is none:
  `OpDef.no_smt`), else `missing` (a test forbids it);
- interval: `explicit`, else `fallback` ([0, 1] for bool results, unbounded otherwise);
- cost: `explicit`, else `generic` (one FLOP per result element, every operand read once).

`tv_treatment` says how translation validation sees the op: expanded through its decomposition
(fused, target and extension ops: the decomposition is the op's meaning), else an uninterpreted
function of its operand terms.

Imports no solver: the encodings named by `lazy(...)` load only when evaluated.
"""

from __future__ import annotations

from llmir_core.dialects.opdef import OpDef


def smt_source(od: OpDef) -> str:
    if od.smt is not None:
        return "explicit"
    return "none" if od.no_smt else "missing"


def interval_source(od: OpDef) -> str:
    return "explicit" if od.interval is not None else "fallback"


def cost_source(od: OpDef) -> str:
    return "explicit" if od.cost is not None else "generic"


def expands_in_tv(od: OpDef) -> bool:
    """Translation validation expands every op that declares a decomposition (fused `llm.*`,
    target `ort.*`, a plugin's extension ops) through it, its definition, so it meets the ops
    it replaced or that replace it."""
    return od.decompose is not None


def tv_treatment(od: OpDef) -> str:
    if expands_in_tv(od):
        return "expanded through its decomposition"
    return "uninterpreted function of its operands"


def meaning_of(od: OpDef) -> dict[str, str]:
    return {"smt": smt_source(od), "interval": interval_source(od), "cost": cost_source(od)}
