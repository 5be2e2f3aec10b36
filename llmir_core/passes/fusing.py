"""The driver of the fusion and lifting passes: the rule driver of `rewriting.py` plus one more
condition, that every value the pattern covers besides its root is used only inside the pattern
(otherwise the ops computing it would stay for their other users and the fusion would compute
them twice).

Each application inserts the replacement just before the root, redirects the root's uses, erases
the covered ops that became dead, gives the new value the root's name, and logs a
`RuleInstance` (with the bindings the rule's check added, such as a derived scale) for
translation validation. Rules without a proof certificate are refused unless the context allows.
"""

from __future__ import annotations

from llmir_core.ir.core import Function, Module, Op
from llmir_core.ir.types import DType, TensorType
from llmir_core.rewrite.library import is_proved
from llmir_core.rewrite.rule import Rule, RuleInstance, value_loc
from llmir_core.rewrite.terms import C, Match, V, build, leaves

from .base import PassContext, erase_dead, replace_uses, scratch_builder, use_counts
from .rewriting import MAX_ROUNDS, _adopt_name


def apply_fusions(module: Module, ctx: PassContext, rules: list[Rule],
                  may_share: frozenset[str] = frozenset()) -> bool:
    """Apply `rules` to a fixed point; covered ops named in `may_share` (cheap ops such as a
    table lookup shared by the q and k rotaries) may also be used outside the pattern."""
    usable = [r for r in rules if is_proved(r) or ctx.allow_unproved]
    refused = [r for r in rules if r not in usable]
    by_root: dict[str, list[Rule]] = {}
    for r in usable:
        by_root.setdefault(r.lhs.op, []).append(r)
    changed = False
    seen: set[tuple[str, str]] = set()
    for fn in module.functions:
        _report_refused(fn, ctx, refused)
        for _ in range(MAX_ROUNDS):
            if not _round(fn, ctx, by_root, seen, may_share):
                break
            changed = True
    return changed


def _report_refused(fn: Function, ctx: PassContext, refused: list[Rule]) -> None:
    for op in fn.ops:
        for r in refused:
            if r.lhs.op == op.name and r.match(op) is not None:
                ctx.rejected(r.name, op.results[r.lhs.result], "rule has no proof certificate "
                             "(run `llmir verify --rules`, or pass --allow-unproved)")


def interior_escape(m: Match, uses: dict[int, int], may_share: frozenset[str] = frozenset()) -> str | None:
    """The name of a covered value (not the root) that is also used outside the pattern."""
    ops = list({id(o): o for o in m.ops}.values())  # a pattern may cover an op twice
    inside: dict[int, int] = {}
    for op in ops:
        for v in op.operands:
            inside[id(v)] = inside.get(id(v), 0) + 1
    for op in ops[1:]:
        if op.name in may_share:
            continue
        for r in op.results:
            if uses.get(id(r), 0) > inside.get(id(r), 0):
                return r.name
    return None


def _round(fn: Function, ctx: PassContext, by_root: dict[str, list[Rule]],
           seen: set[tuple[str, str]], may_share: frozenset[str]) -> bool:
    changed = False
    matched: list[Op] = []
    uses = use_counts(fn)
    i = len(fn.ops) - 1
    while i >= 0:  # consumers first: the largest pattern ending at an op wins (maximal munch)
        op = fn.ops[i]
        for r in by_root.get(op.name, ()):
            m = r.match(op)
            if m is None:
                continue
            root_v = op.results[r.lhs.result]
            escaped = interior_escape(m, uses, may_share)
            reason = (f"%{escaped} is also used outside the pattern" if escaped is not None
                      else r.reject_reason(m))
            if reason is not None:
                if (r.name, root_v.name) not in seen:  # report each candidate once
                    seen.add((r.name, root_v.name))
                    ctx.rejected(r.name, root_v, reason)
                continue
            dt = root_v.type.dtype if isinstance(root_v.type, TensorType) and \
                isinstance(root_v.type.dtype, DType) and root_v.type.dtype.is_float else DType.f32
            b, new_ops = scratch_builder(fn, op.origin)
            try:
                new_v = build(r.rhs, m, b, dt)
            except Exception as exc:  # noqa: BLE001 - the replacement does not type-check here
                ctx.rejected(r.name, root_v, f"replacement does not build: {exc}")
                continue
            fn.ops[i:i] = new_ops
            loc = value_loc(root_v)
            replace_uses(fn, root_v, new_v)
            ctx.applied(r.name, root_v, r.summary)
            matched.extend(m.ops)
            root_name = root_v.name
            if new_v.owner is not None and new_ops:
                _adopt_name(fn, root_v, new_v)
            all_leaves = leaves(r.lhs)
            leaves(r.rhs, all_leaves)
            ctx.instances.append(RuleInstance(
                rule=r.name, root=root_name, replacement=new_v.name,
                bindings={k: m.values[k].name for k, leaf in all_leaves.items()
                          if isinstance(leaf, V) and k in m.values},
                consts={k: m.consts[k] for k, leaf in all_leaves.items() if isinstance(leaf, C) and k in m.consts},
                attrs=dict(m.attrs), location=loc))
            uses = use_counts(fn)
            changed = True
            break
        i -= 1
    if matched:
        erase_dead(fn, matched)
    return changed
