"""The rewrite engine: every pass that rewrites applies library rules through it, so the report
and translation validation see every rewrite the same way.

One rewrite (`rewrite`) replaces one or more root values at once, each by its rule's replacement
(`Part`): merge-qkv replaces the three projections of one activation, fuse-add-rms-norm the
norm and the residual sum, assign-precision every result of an op. The engine
1. refuses rules without a proof certificate (unless the context allows unproved rules);
2. matches each rule's pattern at its root, consistently with the bindings of the other parts
   and any `seed` bindings the pass supplies (values it created, derived attributes), and runs
   each rule's check, which returns the reason it does not apply;
3. with `exclusive`, refuses when a covered value other than a root is also used outside the
   pattern (the fusion would compute it twice), except ops named in `may_share`;
4. builds the replacements once (parts share their common subterms: one fused op, one concat),
   inserts them before the earliest root, hoisting pure definitions of leaves that come later
   (weights are often defined next to their first use), redirects the roots' uses, gives the
   new values the roots' names, erases what became dead;
5. logs one `Rewrite` (report) and one `RuleInstance` (translation validation) per part.

`apply_rules` is the pattern-driven driver on top: it tries every rule at every op, consumers
first (the largest pattern ending at an op wins), to a fixed point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, TensorType
from llmir_core.rewrite.library import is_proved
from llmir_core.rewrite.rule import Rule, RuleInstance, value_loc
from llmir_core.rewrite.terms import C, Match, V, build, leaves, match

from .base import (
    PassContext,
    erase_dead,
    is_pure,
    replace_uses,
    scratch_builder,
    take_over,
    use_counts,
)

MAX_ROUNDS = 8
UNPROVED = "rule has no proof certificate (run `llmir verify --rules`, or pass --allow-unproved)"


@dataclass
class Part:
    """One root of a rewrite: `root` becomes `rule.rhs`; `attrs` bind attributes for this part
    only (e.g. the dtype one result is cast back to); `detail` is its report line."""

    rule: Rule
    root: Value
    attrs: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    replacement: Value | None = None  # set by the engine once applied


def usable(rule: Rule, ctx: PassContext) -> bool:
    return ctx.allow_unproved or is_proved(rule)


def interior_escape(
    ops: Iterable[Op],
    roots: Iterable[Op],
    uses: dict[int, int],
    may_share: frozenset[str] = frozenset(),
) -> str | None:
    """The name of a covered value (not a root) that is also used outside the covered ops."""
    covered = list({id(o): o for o in ops}.values())  # a pattern may cover an op twice
    root_ids = {id(o) for o in roots}
    inside: dict[int, int] = {}
    for op in covered:
        for v in op.operands:
            inside[id(v)] = inside.get(id(v), 0) + 1
    for op in covered:
        if id(op) in root_ids or op.name in may_share:
            continue
        for r in op.results:
            if uses.get(id(r), 0) > inside.get(id(r), 0):
                return r.name
    return None


def rewrite(
    fn: Function,
    ctx: PassContext,
    parts: Sequence[Part],
    seed: Match | None = None,
    *,
    prelude: Sequence[Op] = (),
    exclusive: bool = False,
    may_share: frozenset[str] = frozenset(),
    report: bool = True,
) -> str | None:
    """Apply `parts` as one rewrite. Returns None when applied, else the reason (logged as a
    rejection at the first root when `report`). `prelude` ops (new definitions the pass made,
    such as quantized weights) are inserted before the replacement."""
    reason, m = _joint_match(ctx, parts, seed)
    if reason is None and exclusive:
        escaped = interior_escape(
            m.ops,
            [p.root.owner for p in parts if p.root.owner is not None],
            use_counts(fn),
            may_share,
        )
        if escaped is not None:
            reason = f"%{escaped} is also used outside the pattern"
    if reason is None:
        reason = _apply(fn, ctx, parts, m, list(prelude))
    if reason is not None and report:
        ctx.rejected(parts[0].rule.name, parts[0].root, reason)
    return reason


def _joint_match(
    ctx: PassContext, parts: Sequence[Part], seed: Match | None
) -> tuple[str | None, Match]:
    m = (
        Match(dict(seed.values), dict(seed.consts), dict(seed.attrs))
        if seed is not None
        else Match()
    )
    for p in parts:
        if not usable(p.rule, ctx):
            return UNPROVED, m
        op = p.root.owner
        if op is None or op.name != p.rule.lhs.op or p.root.index != p.rule.lhs.result:
            return f"%{p.root.name} is not computed by {p.rule.lhs.op}", m
        mi = Match(dict(m.values), dict(m.consts), dict(m.attrs))
        if match(p.rule.lhs, p.root, mi) is None:
            return f"%{p.root.name} does not match {p.rule.name} with the other parts' operands", m
        reason = p.rule.reject_reason(mi)
        if reason is not None:
            return reason, m
        m.values.update(mi.values)
        m.consts.update(mi.consts)
        m.attrs.update(mi.attrs)
        m.ops.extend(mi.ops)
    return None, m


def _const_dtype(v: Value) -> DType:
    t = v.type
    if isinstance(t, TensorType) and isinstance(t.dtype, DType) and t.dtype.is_float:
        return t.dtype
    return DType.f32


def _apply(
    fn: Function, ctx: PassContext, parts: Sequence[Part], m: Match, prelude: list[Op]
) -> str | None:
    roots = [p.root for p in parts]
    root_ops = {id(v.owner): v.owner for v in roots if v.owner is not None}
    first = parts[0].root.owner
    assert first is not None
    b, new_ops = scratch_builder(fn, first.origin)
    cache: dict[Any, Op] = {}
    news: list[Value] = []
    for p in parts:
        mb = Match(m.values, m.consts, {**m.attrs, **p.attrs}, m.ops)
        try:
            news.append(build(p.rule.rhs, mb, b, _const_dtype(p.root), cache))
        except Exception as exc:  # noqa: BLE001 - the replacement does not type-check here
            return f"replacement does not build: {exc}"
    made = {id(o) for o in [*new_ops, *prelude]}
    needed: list[Value] = [
        v for o in [*prelude, *new_ops] for v in o.operands if id(v.owner) not in made
    ]
    needed += [v for v in news if id(v.owner) not in made]
    root_ids = {id(v) for v in roots}
    cyclic = next((v for v in needed if id(v) in root_ids), None)
    if cyclic is not None:
        return f"the replacement reads the replaced value %{cyclic.name}"
    pos = {id(o): i for i, o in enumerate(fn.ops)}
    at = min(pos[i] for i in root_ops)
    reason = hoist(fn, at, needed, set(root_ops))
    if reason is not None:
        return reason
    at = min(fn.ops.index(o) for o in root_ops.values())
    fn.ops[at:at] = prelude + new_ops
    names = [v.name for v in roots]
    locs = [value_loc(v) for v in roots]
    for p, new in zip(parts, news):
        ctx.applied(p.rule.name, p.root, p.detail or p.rule.summary)
        replace_uses(fn, p.root, new)
        p.replacement = new
    for p, new, name, loc in zip(parts, news, names, locs):
        if id(new.owner) in made:
            adopt_name(fn, p.root, new)
        all_leaves = leaves(p.rule.lhs)
        leaves(p.rule.rhs, all_leaves)
        ctx.instances.append(
            RuleInstance(
                rule=p.rule.name,
                root=name,
                replacement=new.name,
                bindings={
                    k: m.values[k].name
                    for k, leaf in all_leaves.items()
                    if isinstance(leaf, V) and k in m.values
                },
                consts={
                    k: m.consts[k]
                    for k, leaf in all_leaves.items()
                    if isinstance(leaf, C) and k in m.consts
                },
                attrs={**m.attrs, **p.attrs},
                location=loc,
            )
        )
    erase_dead(fn, [*m.ops, *root_ops.values()])
    return None


def hoist(
    fn: Function,
    at: int,
    values: Iterable[Value],
    forbidden: set[int] | frozenset[int] = frozenset(),
) -> str | None:
    """Make every value in `values` defined before index `at` by moving the pure ops that compute
    it (and what they read) from after `at` to just before it, in their order. Returns the reason
    when that is impossible (an op with effects, or one of the `forbidden` ops, e.g. the roots)."""
    pos = {id(o): i for i, o in enumerate(fn.ops)}
    move: dict[int, Op] = {}
    stack = [(v, v) for v in values if v.owner is not None and pos.get(id(v.owner), -1) >= at]
    while stack:
        v, leaf = stack.pop()  # v is computed for the value `leaf` the replacement reads
        op = v.owner
        assert op is not None
        if id(op) in move:
            continue
        if id(op) in forbidden:
            return f"%{leaf.name} is computed from the replaced value %{v.name}"
        if not is_pure(op):
            return f"%{leaf.name} is defined after the replaced op, by {op.name}, which has effects"
        move[id(op)] = op
        stack.extend(
            (u, leaf) for u in op.operands if u.owner is not None and pos.get(id(u.owner), -1) >= at
        )
    if move:
        moved = [o for o in fn.ops if id(o) in move]
        rest = [o for o in fn.ops if id(o) not in move]
        fn.ops = rest[:at] + moved + rest[at:]
    return None


def adopt_name(fn: Function, old: Value, new: Value) -> None:
    """Give the replacement the replaced value's name once nothing else uses that value."""
    if use_counts(fn).get(id(old), 0) == 0:
        old_name = old.name
        old.name = old_name + ".dead"
        new.name = old_name


def apply_rules(
    module: Module,
    ctx: PassContext,
    rules: list[Rule],
    *,
    exclusive: bool = False,
    may_share: frozenset[str] = frozenset(),
) -> bool:
    """Apply `rules` (each with one root) wherever they match, consumers first, to a fixed point.
    With `exclusive`, a rule applies only where the values it covers besides its root are used
    only inside its pattern (the fusion and lifting passes)."""
    by_root: dict[str, list[Rule]] = {}
    for r in rules:
        by_root.setdefault(r.lhs.op, []).append(r)
    changed = False
    seen: set[tuple[str, str]] = set()  # (rule, root) rejections already reported
    for fn in module.functions:
        for _ in range(MAX_ROUNDS):
            if not _round(fn, ctx, by_root, seen, exclusive, may_share):
                break
            changed = True
    return changed


def _round(
    fn: Function,
    ctx: PassContext,
    by_root: dict[str, list[Rule]],
    seen: set[tuple[str, str]],
    exclusive: bool,
    may_share: frozenset[str],
) -> bool:
    changed = False
    live = {id(o) for o in fn.ops}
    for op in reversed(list(fn.ops)):
        if id(op) not in live:
            continue
        for r in by_root.get(op.name, ()):
            if r.match(op) is None:
                continue
            root = op.results[r.lhs.result]
            reason = rewrite(
                fn, ctx, [Part(r, root)], exclusive=exclusive, may_share=may_share, report=False
            )
            if reason is None:
                changed = True
                live = {id(o) for o in fn.ops}
                break
            if (r.name, root.name) not in seen:
                seen.add((r.name, root.name))
                ctx.rejected(r.name, root, reason)
    return changed


# the fusion passes' former entry point
def apply_fusions(
    module: Module, ctx: PassContext, rules: list[Rule], may_share: frozenset[str] = frozenset()
) -> bool:
    return apply_rules(module, ctx, rules, exclusive=True, may_share=may_share)


# -- conversion-pattern tables (lowering passes) ---------------------------------------------------


@dataclass(frozen=True)
class Converted:
    """What a conversion makes of one op: the target op's attributes, its operands (None: the
    op's own), ops to insert before it (a split: the first kernel of two) and values of other
    ops that the target op also yields, as its further results (a fusion: the residual sum of a
    skip norm); their producers are erased once unused. `note` adds to the report line;
    `instance` is logged in place of the row's (a library rule the conversion is an instance of,
    such as an approximate quantization rule)."""

    attrs: dict[str, Any]
    operands: list[Value] | None = None
    prelude: list[Op] = field(default_factory=list)
    also: tuple[Value, ...] = ()
    note: str = ""
    instance: RuleInstance | None = None


@dataclass(frozen=True)
class Conversion:
    """One row of a lowering's conversion-pattern table: an op named `source` becomes the op
    `target` (the same results, so every use follows) where `convert(fn, op)` returns what it
    becomes, else the reason it does not apply."""

    name: str
    source: str
    target: str
    convert: Callable[[Function, Op], Converted | str]


def apply_conversions(
    module: Module, ctx: PassContext, table: Sequence[Conversion], legal: Callable[[str], bool]
) -> bool:
    """Convert every op the table has a row for, in order, once: the first row whose target is
    `legal` (the target's capabilities) and whose `convert` applies wins; a rejected op stays as
    it is (the target's capability check names it) and its reasons go to the report. Each
    conversion is logged as a `Rewrite` and a `RuleInstance` (rule = the row's name, bindings =
    its operands by position): translation validation finds no library rule of that name and
    relates the two modules through the target ops' own meaning (their SMT encodings)."""
    rows: dict[str, list[Conversion]] = {}
    for c in table:
        rows.setdefault(c.source, []).append(c)
    changed = False
    for fn in module.functions:
        for op in list(fn.ops):
            for c in rows.get(op.name, ()):
                got = c.convert(fn, op) if legal(c.target) else f"{c.target} is not legal here"
                if isinstance(got, str):
                    ctx.rejected(c.name, op.results[0], got)
                    continue
                _convert(fn, ctx, c, op, got)
                changed = True
                break
    return changed


def _convert(fn: Function, ctx: PassContext, c: Conversion, op: Op, got: Converted) -> None:
    at = fn.ops.index(op)
    fn.ops[at:at] = got.prelude
    op.name, op.attrs = c.target, dict(got.attrs)
    if got.operands is not None:
        op.operands = list(got.operands)
    for v in got.also:
        new = Value(v.name, v.type, op, len(op.results))
        op.results.append(new)
        take_over(fn, v, new)
    if got.also:
        erase_dead(fn, [v.owner for v in got.also if v.owner is not None])
    root = op.results[0]
    detail = f"{c.source} -> {' + '.join([o.name for o in got.prelude] + [c.target])}"
    ctx.applied(c.name, root, detail + (f": {got.note}" if got.note else ""))
    ctx.instances.append(
        got.instance
        or RuleInstance(
            rule=c.name,
            root=root.name,
            replacement=root.name,
            bindings={f"x{i}": v.name for i, v in enumerate(op.operands)},
            consts={},
            attrs=dict(got.attrs),
            location=value_loc(root),
        )
    )
