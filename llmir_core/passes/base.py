"""What every pass shares: the context it reports into, and IR surgery helpers.

A pass is a frozen dataclass with a kebab-case `name`, its options as fields, and
`run(module, ctx) -> bool` (did anything change). Passes record what they did in the
`PassContext`: rewrites applied (with location and the rule instance, which translation
validation replays), and candidates rejected with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from llmir_core.builder import Builder
from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.rewrite.rule import RuleInstance, value_loc


@dataclass
class Rewrite:
    pass_name: str
    rule: str
    location: str
    detail: str = ""


@dataclass
class Rejection:
    pass_name: str
    rule: str
    location: str
    reason: str


@dataclass
class PassContext:
    """Collects what passes did; shared by one pipeline run."""

    allow_unproved: bool = False
    rewrites: list[Rewrite] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    instances: list[RuleInstance] = field(default_factory=list)  # of the pass now running
    current: str = ""

    def applied(self, rule: str, where: Value, detail: str = "") -> None:
        self.rewrites.append(Rewrite(self.current, rule, value_loc(where), detail))

    def rejected(self, rule: str, where: Value, reason: str) -> None:
        self.rejections.append(Rejection(self.current, rule, value_loc(where), reason))


class Pass(Protocol):
    name: ClassVar[str]
    summary: ClassVar[str]

    def run(self, module: Module, ctx: PassContext) -> bool: ...


def use_counts(fn: Function) -> dict[int, int]:
    counts: dict[int, int] = {}
    for op in fn.ops:
        for v in op.operands:
            counts[id(v)] = counts.get(id(v), 0) + 1
    for v in fn.outputs:
        counts[id(v)] = counts.get(id(v), 0) + 1
    return counts


def replace_uses(fn: Function, old: Value, new: Value) -> None:
    for op in fn.ops:
        if any(v is old for v in op.operands):
            op.operands = [new if v is old else v for v in op.operands]
    fn.outputs = [new if v is old else v for v in fn.outputs]


def take_over(fn: Function, old: Value, new: Value) -> None:
    """`new` replaces `old` everywhere and takes its name (the replaced value is renamed
    `NAME.dead` until dead-code removal drops it), so a rewrite keeps the names a user reads."""
    name = old.name
    replace_uses(fn, old, new)
    old.name = name + ".dead"
    new.name = name


def replace_many(fn: Function, mapping: dict[int, Value]) -> None:
    if not mapping:
        return
    for op in fn.ops:
        if any(id(v) in mapping for v in op.operands):
            op.operands = [mapping.get(id(v), v) for v in op.operands]
    fn.outputs = [mapping.get(id(v), v) for v in fn.outputs]


def is_pure(op: Op) -> bool:
    od = get_op(op.name)
    return od is not None and not od.effects


def erase_dead(fn: Function, candidates: Iterable[Op] | None = None) -> int:
    """Remove pure ops whose results are unused (all of them, or only among `candidates`)."""
    allowed = None if candidates is None else {id(o) for o in candidates}
    removed = 0
    counts = use_counts(fn)
    keep: list[Op] = []
    for op in reversed(fn.ops):
        dead = (
            all(counts.get(id(r), 0) == 0 for r in op.results)
            and is_pure(op)
            and (allowed is None or id(op) in allowed)
        )
        if dead:
            removed += 1
            for v in op.operands:
                counts[id(v)] -= 1
        else:
            keep.append(op)
    fn.ops = keep[::-1]
    return removed


def scratch_builder(fn: Function, origin: str | None) -> tuple[Builder, list[Op]]:
    """A builder whose ops go to a side list (spliced in by the caller)."""
    ops: list[Op] = []
    b = Builder(fn, ops=ops)
    b.origin = origin
    return b, ops


def option_fields(cls: Any) -> dict[str, Any]:
    """A pass class's options: name -> default."""
    import dataclasses

    return {f.name: f.default for f in dataclasses.fields(cls)}


def clone_module(module: Module) -> Module:
    """A structural copy (new Ops and Values; attributes are immutable and shared)."""
    out = Module(module.name, [], dict(module.attrs), module.source)
    for fn in module.functions:
        vmap: dict[int, Value] = {}
        args = []
        for a in fn.args:
            na = Value(a.name, a.type, None, 0, a.pos)
            vmap[id(a)] = na
            args.append(na)
        ops = []
        for op in fn.ops:
            nop = Op(
                op.name,
                [vmap[id(v)] for v in op.operands],
                [r.type for r in op.results],
                op.attrs,
                [r.name for r in op.results],
                op.origin,
                op.pos,
            )
            for r, nr in zip(op.results, nop.results):
                vmap[id(r)] = nr
            ops.append(nop)
        nf = Function(fn.name, args, ops, [vmap[id(v)] for v in fn.outputs], dict(fn.attrs), fn.pos)
        nf.return_pos = fn.return_pos
        out.functions.append(nf)
    return out
