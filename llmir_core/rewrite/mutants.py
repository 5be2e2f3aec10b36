"""Mechanical mutants of a rule's replacement, for mutation-testing the prover
(`llmir verify --rules --mutants`): each must be refused (refuted, or its bound not proved)
unless `EQUIVALENT` lists it with the reason it truly computes the same thing.

Operators, applied at every node of the rhs: drop a node (replace it by one of its operands),
swap the first two operands of a non-commutative op, change a literal constant or a numeric
attribute, replace an op by a sibling (add/sub, mul/div, silu/gelu, max/min, exp/log, ...), flip
a boolean attribute (transpose_a / transpose_b, causal, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from .rule import Rule
from .terms import K, T, Term, V, fmt_term

COMMUTATIVE = {"core.add", "core.mul", "core.max", "core.min", "core.equal", "core.not_equal"}
SIBLINGS = {
    "core.add": "core.sub",
    "core.sub": "core.add",
    "core.mul": "core.div",
    "core.div": "core.mul",
    "core.silu": "core.gelu",
    "core.gelu": "core.silu",
    "core.max": "core.min",
    "core.min": "core.max",
    "core.exp": "core.log",
    "core.log": "core.exp",
    "core.sigmoid": "core.tanh",
    "core.tanh": "core.sigmoid",
    "core.relu": "core.neg",
    "core.neg": "core.relu",
    "core.sqrt": "core.rsqrt",
    "core.rsqrt": "core.sqrt",
    "core.reduce_sum": "core.reduce_mean",
    "core.reduce_mean": "core.reduce_sum",
    "core.softmax": "core.log_softmax",
    "core.log_softmax": "core.softmax",
    "llm.rms_norm": "llm.layer_norm",
}

# (rule, mutant description) -> why the mutant computes the same values (reviewed by hand)
# ("*" = any rule)
EQUIVALENT: dict[tuple[str, str], str] = {
    ("*", "drop to_device (keep operand 0)"): "llm.to_device moves a value to a device: its "
    "elements are unchanged (only the tensor type's placement differs)",
}


def equivalent_because(rule: str, description: str) -> str | None:
    return EQUIVALENT.get((rule, description)) or EQUIVALENT.get(("*", description))


@dataclasses.dataclass(frozen=True)
class Mutant:
    rule: Rule
    description: str


def _replace(term: Term, path: tuple[int, ...], new: Term) -> Term:
    if not path:
        return new
    assert isinstance(term, T)
    args = list(term.args)
    args[path[0]] = _replace(args[path[0]], path[1:], new)
    return T(term.op, tuple(args), term.attrs, term.result)


def _nodes(term: Term, path: tuple[int, ...] = ()) -> Iterator[tuple[tuple[int, ...], Term]]:
    yield path, term
    if isinstance(term, T):
        for i, a in enumerate(term.args):
            yield from _nodes(a, path + (i,))


def _edits(term: Term) -> Iterator[tuple[str, Term]]:
    for _path, node in _nodes(term):
        if isinstance(node, V):
            yield f"negate {node.name}", T("core.neg", (node,))
            yield f"double {node.name}", T("core.add", (node, node))
            yield f"halve {node.name}", T("core.mul", (node, K(0.5)))
            continue
        if isinstance(node, K):
            yield f"constant {node.value:g} -> {node.value * 2 + 1:g}", K(node.value * 2 + 1)
            continue
        if not isinstance(node, T):
            continue
        short = node.op.split(".")[-1]
        for k, v in node.attrs.items():
            if isinstance(v, bool):
                yield (
                    f"flip {short}.{k}",
                    T(node.op, node.args, {**node.attrs, k: not v}, node.result),
                )
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                nv = v + 1 if isinstance(v, int) else v * 2 + 1
                yield (
                    f"{short}.{k} {v!r} -> {nv!r}",
                    T(node.op, node.args, {**node.attrs, k: nv}, node.result),
                )
        if node.op in SIBLINGS:
            sib = SIBLINGS[node.op]
            yield f"{short} -> {sib.split('.')[-1]}", T(sib, node.args, node.attrs, node.result)
        if len(node.args) >= 2 and node.op not in COMMUTATIVE and node.args[0] != node.args[1]:
            args = (node.args[1], node.args[0]) + node.args[2:]
            yield f"swap operands of {short}", T(node.op, args, node.attrs, node.result)
        for i, a in enumerate(node.args):
            yield f"drop {short} (keep operand {i})", a


def mutants(rule: Rule) -> list[Mutant]:
    """Every distinct mutant of the rule's rhs (its text differs from the rhs)."""
    out: list[Mutant] = []
    seen = {fmt_term(rule.rhs)}
    for path, node in _nodes(rule.rhs):
        for desc, new in _edits(node):
            if new is node:
                continue
            rhs = _replace(rule.rhs, path, new) if path else new
            text = fmt_term(rhs)
            if text in seen:
                continue
            seen.add(text)
            changes: dict[str, Any] = {"rhs": rhs, "name": f"{rule.name}~{len(out)}"}
            rebuild = getattr(rule.obligation, "rebuild", None)
            if rebuild is not None:
                changes["obligation"] = rebuild(rule.lhs, rhs)
            out.append(Mutant(dataclasses.replace(rule, **changes), desc))
    return out


def sample(rule: Rule, per_rule: int, start: int = 0) -> list[Mutant]:
    """`per_rule` mutants spread over the operators, starting at the `start`-th operator kind
    (deterministic; the suite rotates it by rule)."""
    ms = mutants(rule)
    by_kind: dict[str, list[Mutant]] = {}
    for m in ms:
        by_kind.setdefault(m.description.split(" ")[0], []).append(m)
    picked: list[Mutant] = []
    kinds = sorted(by_kind)
    kinds = kinds[start % len(kinds) :] + kinds[: start % len(kinds)] if kinds else kinds
    while len(picked) < per_rule and any(by_kind.values()):
        for kind in kinds:
            if by_kind[kind] and len(picked) < per_rule:
                picked.append(by_kind[kind].pop(0))
    return picked
