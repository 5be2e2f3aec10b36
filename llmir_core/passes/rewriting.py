"""The greedy driver that applies a rule set: match at each op, check, replace, log.

Each application inserts the replacement just before the matched root (every leaf is defined
earlier), redirects the root's uses, erases the matched ops that became dead, and gives the new
value the root's name so dumps stay diffable. It logs a `RuleInstance` for translation
validation. Rules without a proof certificate are refused unless the context allows them.
"""

from __future__ import annotations

from llmir_core.ir.core import Function, Module
from llmir_core.ir.types import DType, TensorType
from llmir_core.rewrite.library import is_proved
from llmir_core.rewrite.rule import Rule, RuleInstance, value_loc
from llmir_core.rewrite.terms import C, V, build, leaves

from .base import PassContext, erase_dead, replace_uses, scratch_builder, use_counts

MAX_ROUNDS = 8


def apply_rules(module: Module, ctx: PassContext, rules: list[Rule]) -> bool:
    usable: list[Rule] = []
    for r in rules:
        if is_proved(r) or ctx.allow_unproved:
            usable.append(r)
    refused = [r for r in rules if r not in usable]
    by_root: dict[str, list[Rule]] = {}
    for r in usable:
        by_root.setdefault(r.lhs.op, []).append(r)
    changed = False
    seen: set[tuple[str, str]] = set()
    for fn in module.functions:
        for _ in range(MAX_ROUNDS):
            if not _one_round(fn, ctx, by_root, refused, seen):
                break
            changed = True
            refused = []  # report refusals once
    return changed


def _one_round(fn: Function, ctx: PassContext, by_root: dict[str, list[Rule]],
               refused: list[Rule], seen_reject: set[tuple[str, str]]) -> bool:
    changed = False
    matched_ops = []
    i = 0
    while i < len(fn.ops):
        op = fn.ops[i]
        for r in refused:
            if r.lhs.op == op.name and r.match(op) is not None:
                key = (r.name, op.results[0].name)
                if key not in seen_reject:
                    seen_reject.add(key)
                    ctx.rejected(r.name, op.results[0], "rule has no proof certificate "
                                 "(run `llmir verify --rules`, or pass --allow-unproved)")
        for r in by_root.get(op.name, ()):
            m = r.match(op)
            if m is None:
                continue
            reason = r.reject_reason(m)
            root_v = op.results[r.lhs.result]
            if reason is not None:
                key = (r.name, root_v.name)
                if key not in seen_reject:
                    seen_reject.add(key)
                    ctx.rejected(r.name, root_v, reason)
                continue
            dt = root_v.type.dtype if isinstance(root_v.type, TensorType) and \
                isinstance(root_v.type.dtype, DType) else DType.f32
            b, new_ops = scratch_builder(fn, op.origin)
            try:
                new_v = build(r.rhs, m, b, dt if dt.is_float else DType.f32)
            except Exception as exc:  # the replacement does not type-check here
                ctx.rejected(r.name, root_v, f"replacement does not build: {exc}")
                continue
            fn.ops[i:i] = new_ops
            i += len(new_ops)
            replace_uses(fn, root_v, new_v)
            ctx.applied(r.name, root_v, r.text)
            matched_ops.extend(m.ops)
            root_name, root_loc = root_v.name, value_loc(root_v)
            if new_v.owner is not None and new_ops:
                _adopt_name(fn, root_v, new_v)
            ctx.instances.append(RuleInstance(
                rule=r.name, root=root_name, replacement=new_v.name,
                bindings={k: m.values[k].name for k, leaf in leaves(r.lhs).items() if isinstance(leaf, V)},
                consts={k: m.consts[k] for k, leaf in leaves(r.lhs).items() if isinstance(leaf, C)},
                attrs=dict(m.attrs), location=root_loc))
            changed = True
            break
        i += 1
    if matched_ops:
        erase_dead(fn, matched_ops)
    return changed


def _adopt_name(fn: Function, old, new) -> None:  # type: ignore[no-untyped-def]
    """Give the replacement the replaced value's name once nothing else uses that value."""
    if use_counts(fn).get(id(old), 0) == 0:
        old_name = old.name
        old.name = old_name + ".dead"
        new.name = old_name
