"""Translation validation: is the optimized module equivalent to the original?

Both modules become hash-consed tensor-level terms in one table (an op is an uninterpreted
function of its operand terms, keyed by its name, attributes and result type; structurally
equal subgraphs get the same term). `llm.*` ops with a decomposition are expanded through it
(their definitions, proved by the rule library's definition rules), and so are exact target ops
(`ort.*`, through the ops they replaced), so a fused or lowered op and the ops it stands for meet. Each rule instance a pass logged adds `lhs == rhs` (`lhs` the replaced
value's term in the original, `rhs` the rule's replacement built over the original's leaves).
z3 (in a killable child) then decides whether any output can differ (EUF). When it cannot show
equivalence, differential testing against the float64 reference interpreter gives the verdict,
and the result says which method gave it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmir_core.builder import Builder
from llmir_core.dialects.registry import get_op
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.printer import format_attr
from llmir_core.rewrite.library import RULES
from llmir_core.rewrite.rule import RuleInstance
from llmir_core.rewrite.terms import Match, build

from .approx import (
    Approx,
    from_instance,
    is_exact,
    local_bound,
    precondition,
    rediscover,
    rhs_value,
)
from .meaning import expands_in_tv
from .solver import run_job
from .verdicts import EQUIVALENT, INCONCLUSIVE, NOT_EQUIVALENT, WITHIN_BOUND


def _attr_key(v: Any) -> str:
    if isinstance(v, DenseAttr):
        return f"dense:{v.type}:{hashlib.sha1(v.array.tobytes()).hexdigest()}"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}={_attr_key(v[k])}" for k in sorted(v)) + "}"
    if isinstance(v, tuple):
        return "[" + ",".join(_attr_key(x) for x in v) + "]"
    return format_attr(v)


@dataclass
class Terms:
    """One hash-cons table shared by both modules."""

    keys: dict[tuple[Any, ...], int] = field(default_factory=dict)
    nodes: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)  # (symbol, children)
    of_value: dict[int, int] = field(default_factory=dict)  # id(Value) -> term
    expand: bool = True
    keep: list[Any] = field(default_factory=list)  # scratch functions stay alive: ids stay unique
    defs: dict[Any, Any] = field(default_factory=dict)  # decompositions, by op, attrs and types
    base: str = ""  # the folder weight files are relative to (the module's being interned)

    def intern(self, symbol: str, children: tuple[int, ...]) -> int:
        key = (symbol, children)
        t = self.keys.get(key)
        if t is None:
            t = len(self.nodes)
            self.keys[key] = t
            self.nodes.append((symbol, children))
        return t

    def arg(self, i: int, v: Value) -> int:
        t = self.intern(f"arg{i}:{v.type}", ())
        self.of_value[id(v)] = t
        return t

    def op(self, op: Op) -> list[int]:
        od = get_op(op.name)
        kids = tuple(self.of_value[id(v)] for v in op.operands)
        if self.expand and od is not None and expands_in_tv(od):
            outs = self._expand(op, od)
            if outs is not None:
                for r, t in zip(op.results, outs):
                    self.of_value[id(r)] = t
                return outs
        attrs = od.with_defaults(op.attrs) if od is not None else op.attrs
        if op.name == "core.weight" and isinstance(attrs.get("file"), str):
            # a weight file is named relative to its module's folder: the same bytes read from
            # two folders are the same leaf
            attrs = {**attrs, "file": os.path.normpath(os.path.join(self.base, attrs["file"]))}
        akey = ",".join(f"{k}={_attr_key(attrs[k])}" for k in sorted(attrs))
        outs = []
        for r in op.results:
            t = self.intern(f"{op.name}{{{akey}}}#{r.index}:{r.type}", kids)
            self.of_value[id(r)] = t
            outs.append(t)
        return outs

    def _expand(self, op: Op, od: Any) -> list[int] | None:
        key = (op.name, _attr_key(op.attrs), tuple(str(v.type) for v in op.operands))
        cached = self.defs.get(key)
        if cached is None:
            fn = Function(
                f"{op.name}.def", [Value(f"a{i}", v.type) for i, v in enumerate(op.operands)]
            )
            b = Builder(fn)
            self.keep.append(fn)
            try:
                outs = od.decompose(b, fn.args, od.with_defaults(op.attrs))
            except Exception:  # noqa: BLE001 - keep the op opaque
                outs = None
            cached = self.defs[key] = (fn, outs)
        fn, outs = cached
        if outs is None:
            return None
        for a, v in zip(fn.args, op.operands):
            self.of_value[id(a)] = self.of_value[id(v)]
        for o in fn.ops:
            self.op(o)
        return [self.of_value[id(v)] for v in outs]

    def function(
        self, fn: Function, subst: dict[str, Callable[[Terms], int | None]] | None = None
    ) -> dict[str, int]:
        """Intern fn's values; `subst` replaces the term of a value (by name) by another, built
        when the value is reached (the rhs of an approximate instance over the terms so far)."""
        names = {}
        for i, a in enumerate(fn.args):
            names[a.name] = self.arg(i, a)
        for op in fn.ops:
            self.op(op)
            for r in op.results:
                make = (subst or {}).get(r.name)
                t = make(self) if make is not None else None
                if t is not None:
                    self.of_value[id(r)] = t
                names[r.name] = self.of_value[id(r)]
        return names

    def value_term(self, scratch: Function, v: Value) -> int | None:
        """The term of v, a value built in `scratch` over values already interned."""
        for op in scratch.ops:
            self.op(op)
        return self.of_value.get(id(v))


def signature_mismatch(a: Module, b: Module) -> str | None:
    fa, fb = a.main, b.main
    if len(fa.args) != len(fb.args):
        return (
            f"@{fa.name} takes {len(fa.args)} arguments in one file and {len(fb.args)} in the other"
        )
    for i, (x, y) in enumerate(zip(fa.args, fb.args)):
        if x.type != y.type:
            return f"argument #{i} (%{x.name} vs %{y.name}) has type {x.type} vs {y.type}"
    if len(fa.outputs) != len(fb.outputs):
        return f"@{fa.name} returns {len(fa.outputs)} values in one file and {len(fb.outputs)} in the other"
    for i, (xt, yt) in enumerate(zip(fa.output_types, fb.output_types)):
        if xt != yt:
            return f"result #{i} has type {xt} vs {yt}"
    return None


def _instance_eq(
    tt: Terms,
    inst: RuleInstance,
    before: dict[str, int],
    after: dict[str, int],
    fb: Function,
    fa: Function,
) -> tuple[int, int] | None:
    lhs = before.get(inst.root)
    if lhs is None:
        return None
    if inst.rule == "constant-fold":
        return _fold_eq(inst, lhs, after, fb, fa)
    if inst.rule not in RULES:
        return None
    rule = RULES[inst.rule]
    vals_b = {v.name: v for v in fb.values()}
    vals_a = {v.name: v for v in fa.values()}
    m = Match()
    for leaf, name in inst.bindings.items():
        v = vals_b.get(name) or vals_a.get(name)
        if v is None:
            return None
        m.values[leaf] = v
    m.consts = dict(inst.consts)
    m.attrs = dict(inst.attrs)
    scratch = Function("instance", [])
    tt.keep.append(scratch)
    b = Builder(scratch)
    try:
        v = build(rule.rhs, m, b)
    except Exception:  # noqa: BLE001 - cannot rebuild: the instance adds nothing
        return None
    for op in scratch.ops:
        tt.op(op)
    rhs = tt.of_value.get(id(v))
    return None if rhs is None else (lhs, rhs)


def congruence_closure(
    nodes: list[tuple[str, tuple[int, ...]]],
    eqs: list[tuple[int, int]],
    goals: list[tuple[int, int]],
) -> bool:
    """Decide the EUF query in-process: do the equalities force every goal pair equal?

    The classic congruence closure (union-find, use lists, a signature table keyed by the
    children's representatives); complete for ground equalities, near-linear. z3 is asked only
    when this says no.
    """
    find = closure(nodes, eqs)
    return all(find(a) == find(b) for a, b in goals)


def closure(
    nodes: list[tuple[str, tuple[int, ...]]], eqs: list[tuple[int, int]]
) -> Callable[[int], int]:
    """The congruence closure of `eqs` over the term DAG `nodes`: term -> its class."""
    parent = list(range(len(nodes)))
    uses: list[list[int]] = [[] for _ in nodes]
    table: dict[tuple[str, tuple[int, ...]], int] = {}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, (sym, kids) in enumerate(nodes):
        if kids:
            for k in set(kids):
                uses[k].append(i)
            table.setdefault((sym, kids), i)
    pending = list(eqs)
    while pending:
        a, b = pending.pop()
        ra, rb = find(a), find(b)
        if ra == rb:
            continue
        if len(uses[ra]) < len(uses[rb]):
            ra, rb = rb, ra
        parent[rb] = ra
        for p in uses[rb]:
            sym, kids = nodes[p]
            key = (sym, tuple(find(k) for k in kids))
            q = table.get(key)
            if q is None:
                table[key] = p
            elif find(q) != find(p):
                pending.append((p, q))
        uses[ra].extend(uses[rb])
        uses[rb] = []
    return find


def per_op(
    tt: Terms, before: Function, after: Function, find: Callable[[int], int], by_smt: bool
) -> list[dict[str, Any]]:
    """How the ops of `after` were validated, counted by op name and way: `smt` when the whole
    module was decided on terms (`by_smt`), or when the op's result terms are equal (congruent,
    given the rule instances) to terms of the original; `differential` otherwise, with the
    reason: an operand already differs, the op's declared `no_smt`, or that its result has no
    equal term in the original (where the modules diverge)."""
    from .meaning import tv_treatment

    original = {find(tt.of_value[id(v)]) for v in before.values() if id(v) in tt.of_value}
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for op in after.ops:
        od = get_op(op.name)

        def same(vs: Any) -> bool:
            return all(
                (t := tt.of_value.get(id(v))) is not None and find(t) in original for v in vs
            )

        if by_smt or same(op.results):
            way, how = "smt", tv_treatment(od) if od is not None else "unknown op"
        else:
            way = "differential"
            if not same(op.operands):
                how = "an operand already differs from the original's"
            elif od is not None and od.no_smt:
                how = od.no_smt
            elif op.attrs.get("quantize", "none") != "none":
                how = "it rounds its weight to blocks (llm.quantize): no rule instance relates it to the original"
            else:
                how = "its operands match the original's, its result has no equal term there"
        row = rows.setdefault(
            (op.name, way, how), {"op": op.name, "count": 0, "validated_by": way, "how": how}
        )
        row["count"] += 1
    return sorted(rows.values(), key=lambda r: (r["validated_by"] != "differential", r["op"]))


def _fold_eq(
    inst: RuleInstance, lhs: int, after: dict[str, int], fb: Function, fa: Function
) -> tuple[int, int] | None:
    """A folded constant is trusted only after re-evaluating the original op (the reference
    interpreter is the oracle): a wrong fold adds no equality, so validation catches it."""
    import numpy as np

    from llmir_core.interp import Interpreter

    rhs = after.get(inst.replacement)
    vb = next((v for v in fb.values() if v.name == inst.root), None)
    va = next((v for v in fa.values() if v.name == inst.replacement), None)
    if rhs is None or vb is None or va is None or vb.owner is None or va.owner is None:
        return None
    try:
        args = [np.asarray(o.owner.attrs["value"].array) for o in vb.owner.operands]  # type: ignore[union-attr]
        got = Interpreter(Module()).eval_op(vb.owner, args, {})[vb.index]
        want = va.owner.attrs["value"].array
    except Exception:  # noqa: BLE001 - cannot re-evaluate: no equality
        return None
    if np.shape(got) != np.shape(want) or not np.array_equal(np.asarray(got), want, equal_nan=True):
        return None
    return lhs, rhs


def _euf_job(
    nodes: list[tuple[str, tuple[int, ...]]],
    eqs: list[tuple[int, int]],
    goals: list[tuple[int, int]],
    limit_s: float,
) -> dict[str, Any]:
    import z3

    S = z3.DeclareSort("T")
    funcs: dict[tuple[str, int], Any] = {}
    terms: list[Any] = []
    for i, (sym, kids) in enumerate(nodes):
        if not kids:
            terms.append(z3.Const(f"t{i}", S))
            continue
        key = (sym, len(kids))
        f = funcs.get(key)
        if f is None:
            f = funcs[key] = z3.Function(f"f{len(funcs)}", *([S] * len(kids)), S)
        terms.append(f(*[terms[k] for k in kids]))
    s = z3.Solver()
    s.set("timeout", int(limit_s * 1000))
    for a, b in eqs:
        s.add(terms[a] == terms[b])
    s.add(z3.Or([terms[a] != terms[b] for a, b in goals]))
    r = s.check()
    verdict = "unsat" if r == z3.unsat else "sat" if r == z3.sat else "unknown"
    return {"verdict": verdict, "reason": s.reason_unknown() if verdict == "unknown" else ""}


def validate(
    before: Module,
    after: Module,
    instances: list[RuleInstance] | None = None,
    limit_s: float = 10.0,
    differential: bool = True,
    seeds: int = 2,
    tol: float | None = None,
    tol_why: str = "",
) -> dict[str, Any]:
    """Decide whether `after` computes what `before` computes. Returns a verdict dict. tol: the
    differential tolerance of a pass that rounds values on purpose (tol_why says why)."""
    note: dict[str, Any] = {}
    if signature_mismatch(before, after) is not None:
        from llmir_core.targets import get_target

        last = get_target("onnxruntime").last_logits_interface(before, after)
        if last is not None:  # after computes the logits of the last position only
            before = last
            note = {"interface": "logits compared at the last position (lower-ort-logits)"}
    verdict = _validate(before, after, instances, limit_s, differential, seeds, tol, tol_why)
    return {**verdict, **note}


def _validate(
    before: Module,
    after: Module,
    instances: list[RuleInstance] | None = None,
    limit_s: float = 10.0,
    differential: bool = True,
    seeds: int = 2,
    tol: float | None = None,
    tol_why: str = "",
    input_range: tuple[float, float] = (-1.0, 1.0),
) -> dict[str, Any]:
    t0 = time.perf_counter()

    def done(res: dict[str, Any]) -> dict[str, Any]:
        return {**res, "seconds": time.perf_counter() - t0}

    why = signature_mismatch(before, after)
    if why is not None:
        return done(_different_signatures(before, after, why, differential))
    fb, fa = before.main, after.main
    exact, logged = _split(instances or [], fb, fa)
    keep: list[Any] = []
    found: list[Approx] = []
    if instances is None:  # two files: find the instances (verify --against)
        found = rediscover(before, after, RULES, keep)
        logged = [a for a in found if not is_exact(a.rule)]
    exact_found = [a for a in found if is_exact(a.rule)]
    # 1. exact: congruence closure over the exact rule instances only
    tt, goals, find, eqs = _decide(before, after, exact, {}, exact_found, keep)
    info: dict[str, Any] = {"terms": len(tt.nodes), "instances": len(instances or [])}
    if not goals:
        return done(
            {
                "verdict": EQUIVALENT,
                "method": "smt (hash-consed terms identical)",
                **info,
                "ops": per_op(tt, fb, fa, find, True),
            }
        )
    if all(find(a) == find(b) for a, b in goals):
        return done(
            {
                "verdict": EQUIVALENT,
                "method": "EUF (congruence closure over hash-consed terms + "
                f"{len(eqs)} exact rule instances)",
                **info,
                "ops": per_op(tt, fb, fa, find, True),
            }
        )
    # 2. approximate: the original with each approximate instance's root replaced by its rhs
    if logged:
        bounded = _approximate(before, after, exact, logged, exact_found, keep, input_range)
        if bounded is not None:
            return done({**info, **bounded})
    # 3. z3 over the same EUF query (exact instances only)
    res = run_job(_euf_job, tt.nodes, eqs, goals, limit_s, limit_s=limit_s)
    info["smt"] = res["verdict"]
    if res["verdict"] == "unsat":
        return done(
            {
                "verdict": EQUIVALENT,
                "method": "smt (EUF over hash-consed terms + exact rule instances)",
                **info,
                "ops": per_op(tt, fb, fa, find, True),
            }
        )
    info["ops"] = per_op(tt, fb, fa, find, False)
    if not differential:
        return done(
            {
                "verdict": INCONCLUSIVE,
                "method": "smt",
                "details": [res.get("reason", "z3 could not show equivalence")],
                **info,
            }
        )
    # 4. differential: evidence or a counterexample, never a proof
    d = _differential(before, after, res["verdict"], seeds, tol, tol_why, input_range)
    return done({**info, **d})


def _different_signatures(
    before: Module, after: Module, why: str, differential: bool
) -> dict[str, Any]:
    """Not equivalent, unless `after` only swaps the f32 KV cache for a calibrated int8 one
    (kv-cache-int8), which is measured instead."""
    from . import kv_int8

    scales = kv_int8.int8_interface(before, after) if differential else None
    if scales is not None:
        return kv_int8.compare(before, after, scales)
    return {"verdict": NOT_EQUIVALENT, "method": "signature", "details": [why], "signature": why}


def _approximate(
    before: Module,
    after: Module,
    exact: list[Any],
    approx: list[Approx],
    exact_found: list[Approx],
    keep: list[Any],
    input_range: tuple[float, float],
) -> dict[str, Any] | None:
    """When the original with each approximate instance applied is `after` (EUF), the
    composed error bound (`within_bound`); else None."""
    subst = {a.root.name: _rhs_maker(a, keep) for a in approx}
    tt2, goals2, find2, eqs2 = _decide(before, after, exact, subst, exact_found, keep)
    if not all(find2(a) == find2(b) for a, b in goals2):
        return None
    res = within_bound(before, after, approx, input_range)
    res.setdefault(
        "structure",
        f"EUF: the original with {len(approx)} approximate rule instances applied "
        f"(+ {len(eqs2)} exact instances)",
    )
    ops = per_op(tt2, before.main, after.main, find2, True)
    return {"approximate_instances": len(approx), **res, "ops": ops}


def _differential(
    before: Module,
    after: Module,
    smt: str,
    seeds: int,
    tol: float | None,
    tol_why: str,
    input_range: tuple[float, float],
) -> dict[str, Any]:
    """The two modules run on random inputs: a counterexample, or agreement (never a proof)."""
    from .differential import compare

    d = compare(before, after, seeds=seeds, tol=tol, why=tol_why)
    d["smt"] = smt if smt != "sat" else "could not show equivalence"
    if d.get("agree"):
        d["details"] = [
            "no proof: SMT could not show equivalence and no bound was composed; the outputs "
            "agree on the inputs tried"
        ] + _measured_details(before, after, input_range)
    return d


def _measured_details(before: Module, after: Module, input_range: tuple[float, float]) -> list[str]:
    from .differential import max_error

    try:
        m = max_error(before, after, input_range)
    except Exception:  # noqa: BLE001 - the measurement is extra information only
        return []
    return [f"measured max |error| {m['max_error']:.3g} (output #{m['output']})"]


def _split(
    instances: list[RuleInstance], fb: Function, fa: Function
) -> tuple[list[RuleInstance], list[Approx]]:
    """The exact instances (tag exact or reassociating, constant folds re-evaluated) and the
    approximate ones, resolved to values."""
    exact, approx = [], []
    for inst in instances:
        rule = RULES.get(inst.rule)
        if rule is None or is_exact(rule):
            exact.append(inst)
            continue
        a = from_instance(inst, rule, fb, fa)
        if a is not None:
            approx.append(a)
    return exact, approx


def _rhs_maker(a: Approx, keep: list[Any]) -> Callable[[Terms], int | None]:
    def make(tt: Terms) -> int | None:
        built = rhs_value(a, keep)
        return None if built is None else tt.value_term(*built)

    return make


def _folder(m: Module) -> str:
    return os.path.dirname(os.path.abspath(m.source)) if m.source else os.getcwd()


def _decide(
    before: Module,
    after: Module,
    exact: list[RuleInstance],
    subst: dict[str, Callable[[Terms], int | None]],
    found: list[Approx],
    keep: list[Any],
) -> tuple[Terms, list[tuple[int, int]], Callable[[int], int], list[tuple[int, int]]]:
    """Intern both modules (the original with `subst` applied), add the exact instances'
    equalities (logged, and `found` in the two files), close: (terms, output goals, the
    closure, the equalities)."""
    tt = Terms()
    tt.keep.append(keep)
    fb, fa = before.main, after.main
    tt.base = _folder(after)
    na = tt.function(fa)
    tt.base = _folder(before)
    nb = tt.function(fb, subst)
    outs_b = [tt.of_value[id(v)] for v in fb.outputs]
    outs_a = [tt.of_value[id(v)] for v in fa.outputs]
    goals = [(x, y) for x, y in zip(outs_b, outs_a) if x != y]
    eqs = []
    for inst in exact if goals else []:
        e = _instance_eq(tt, inst, nb, na, fb, fa)
        if e is not None:
            eqs.append(e)
    for a in found if goals else []:
        rhs = _rhs_maker(a, keep)(tt)
        if rhs is not None:
            eqs.append((tt.of_value[id(a.root)], rhs))
    return tt, goals, closure(tt.nodes, eqs), eqs


def _preconditions(approx: list[Approx], rb: Any, ra: Any) -> dict[str, Any] | None:
    """The verdict when an approximate instance's precondition fails (not equivalent) or is not
    shown (inconclusive) on the concrete weights; None when every one holds."""
    for a in approx:
        pre = precondition(a, rb, ra)
        if pre is not None and pre[0] == "fails":
            return {
                "verdict": NOT_EQUIVALENT,
                "method": "precondition of an approximate rule instance",
                "details": [f"{a.rule.name} at {a.location}: its precondition fails: {pre[1]}"],
                "first_difference": a.root.name,
            }
        if pre is not None:
            return {
                "verdict": INCONCLUSIVE,
                "method": "precondition of an approximate rule instance",
                "details": [
                    f"{a.rule.name} at {a.location}: its precondition is not shown: {pre[1]}"
                ],
            }
    return None


def within_bound(
    before: Module, after: Module, approx: list[Approx], input_range: tuple[float, float]
) -> dict[str, Any]:
    """The verdict once the structure matches up to approximate instances: each instance's
    precondition on the concrete weights, B composed over them (`error_bounds`), and the
    measured error, which must not exceed B."""
    from . import error_bounds as eb
    from .differential import max_error

    rb, ra = eb.Ranges(before, input_range), eb.Ranges(after, input_range)
    refused = _preconditions(approx, rb, ra)
    if refused is not None:
        return refused

    def local_of(a: Approx) -> eb.LocalFn:
        def f(err: Callable[[Value], float]) -> float:
            a.local, a.how = local_bound(a, rb, ra, err)
            return a.local

        return f

    comp = eb.compose(before, rb, {a.root.name: local_of(a) for a in approx})
    fallback = sum(a.how.startswith("fallback") for a in approx)
    bound_info = {
        "bound": comp.bound,
        "bound_is": "max |optimized - original| over the float outputs, for every input whose "
        f"float elements lie in [{input_range[0]:g}, {input_range[1]:g}]",
        "output_bounds": comp.outputs,
        "rule_instances": [a.to_json() for a in approx],
        "fallback_bounds": fallback,
        "input_range": list(input_range),
    }
    try:
        m = max_error(before, after, input_range)
    except Exception as exc:  # noqa: BLE001 - cannot run: no measurement
        return {
            "verdict": INCONCLUSIVE,
            "method": "bound composition",
            "details": [f"the reference interpreter cannot run these modules: {exc}"],
            **bound_info,
        }
    bound_info["measured"] = m["max_error"]
    how = (
        f"EUF + {len(approx)} approximate rule instances, B composed over them"
        + (f" ({fallback} with fallback bounds)" if fallback else "")
        + f"; measured {m['max_error']:.3g} <= B"
    )
    if comp.blocker is not None:
        return {
            "verdict": INCONCLUSIVE,
            "method": "EUF + approximate rule instances; no finite bound",
            "details": [
                f"B = inf: {comp.blocker}",
                f"measured max |error| {m['max_error']:.3g} (output #{m['output']})",
            ],
            **bound_info,
        }
    if m["max_error"] > comp.bound:
        return {
            "verdict": NOT_EQUIVALENT,
            "method": "differential check of the composed bound",
            "details": [
                f"output #{m['output']}: measured |error| {m['max_error']:.6g} exceeds the "
                f"composed bound B = {comp.bound:.6g} (a wrong bound or a wrong compile)",
            ],
            "input": m["input"],
            "input_desc": m["input_desc"],
            **bound_info,
        }
    return {"verdict": WITHIN_BOUND, "method": how, **bound_info}


def validate_pass(
    before: Module, after: Module, instances: list[RuleInstance], pass_name: str
) -> dict[str, Any]:
    """A pass whose class declares `validation_rtol` rounds values on purpose (16-bit weight
    storage): when SMT and the rule instances cannot show more, its differential check uses that
    relative tolerance, scaled by depth, and the verdict is never `equivalent`: `within bound`
    when a bound was composed, else `inconclusive` with the measured error."""
    from llmir_core.passes import PASSES

    rtol = getattr(PASSES.get(pass_name), "validation_rtol", None)
    if rtol is None:
        return validate(before, after, instances)
    return validate(
        before,
        after,
        instances,
        tol=float(rtol) * (1.0 + before.op_count() / 200.0),
        tol_why=f"{pass_name} rounds weights: its declared tolerance",
    )
