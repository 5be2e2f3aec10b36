"""Approximate rule instances in translation validation: which rules count as exact, the local
error bound of an instance and its numeric precondition, and finding the instances of two files
(`verify --against`, where no pass logged them).

A rule is exact when its tag is `exact` or `reassociating`: both are proved `lhs == rhs` over the
reals, which is what a module means (every op's meaning is its real-valued function: the SMT
encodings, computed by the reference interpreter in float64; how a backend orders a sum is the
backend's tolerance, not the module's meaning: no op in the IR fixes a summation order). Tag
`approximate` rules (quantization, rounding to a narrower type) change the real-valued function:
an instance of one makes the verdict `within bound B` at best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.builder import Builder
from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, TensorType
from llmir_core.rewrite.bounds import UNIT_ROUNDOFF
from llmir_core.rewrite.rule import Rule, RuleInstance, value_loc
from llmir_core.rewrite.terms import Match, build, leaves, match

from . import error_bounds as eb

EXACT_TAGS = ("exact", "reassociating")
_MATMULS = ("core.matmul", "llm.linear", "llm.gated_mlp", "llm.quantized_matmul")


def is_exact(rule: Rule) -> bool:
    return rule.tag in EXACT_TAGS


@dataclass
class Approx:
    """One approximate instance: lhs leaves bound to the original's values, the leaves only the
    rhs has (codes, scales) to the optimized module's."""

    rule: Rule
    root: Value  # in the original
    match: Match
    location: str
    local: float = 0.0  # the local bound, once composed
    how: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule.name,
            "location": self.location,
            "local_bound": self.local,
            "bound_from": self.how,
        }


def from_instance(inst: RuleInstance, rule: Rule, fb: Function, fa: Function) -> Approx | None:
    vb = {v.name: v for v in fb.values()}
    va = {v.name: v for v in fa.values()}
    root = vb.get(inst.root)
    if root is None:
        return None
    lhs_leaves = set(leaves(rule.lhs))
    m = Match()
    for leaf, name in inst.bindings.items():
        v = (vb.get(name) or va.get(name)) if leaf in lhs_leaves else (va.get(name) or vb.get(name))
        if v is None:
            return None
        m.values[leaf] = v
    m.consts, m.attrs = dict(inst.consts), dict(inst.attrs)
    return Approx(rule, root, m, inst.location)


def rhs_value(a: Approx, keep: list[Any]) -> tuple[Function, Value] | None:
    """The rule's rhs built over the instance's leaves (in a scratch function kept alive)."""
    scratch = Function("instance", [])
    keep.append(scratch)
    try:
        v = build(a.rule.rhs, a.match, Builder(scratch))
    except Exception:  # noqa: BLE001 - cannot rebuild: no substitution
        return None
    return scratch, v


# -- finding the instances of two files ----------------------------------------------------------


def _rhs_match(rule: Rule, v: Value, keep: list[Any], depth: int = 2) -> Match | None:
    """Match the rule's rhs at v, or at v's op's decomposition (a lowered op: ort.matmul_nbits
    stands for llm.quantized_matmul over the same codes)."""
    m = match(rule.rhs, v)
    if m is not None or depth == 0 or v.owner is None:
        return m
    op = v.owner
    od = get_op(op.name)
    if od is None or od.decompose is None:
        return None
    scratch = Function("def", [])
    keep.append(scratch)
    try:
        outs = od.decompose(Builder(scratch), list(op.operands), od.with_defaults(op.attrs))
    except Exception:  # noqa: BLE001 - no decomposition for these attributes
        return None
    return _rhs_match(rule, outs[v.index], keep, depth - 1)


def rediscover(
    before: Module, after: Module, rules: dict[str, Rule], keep: list[Any]
) -> list[Approx]:
    """The rule instances that turn `before` into `after`: an op of the original that a rule's
    lhs matches, paired with the op of the optimized module that keeps its
    result's name (and model location) and that the rule's rhs matches, directly or through its
    decomposition; an exact rule whose rhs has no leaf of its own needs no pairing (an
    instance wherever its lhs matches). Soundness does not depend on the pairing: every pair is a true instance of
    the rule (its precondition is checked on the concrete codes), and the verdict still needs
    the whole module to match."""
    fb, fa = before.main, after.main
    by_name: dict[str, Value] = {}
    for op in fa.ops:
        for res in op.results:
            by_name[res.name] = res
    by_op: dict[str, list[Rule]] = {}
    for rule in rules.values():
        by_op.setdefault(rule.lhs.op, []).append(rule)
    found: list[Approx] = []
    for op in fb.ops:
        for rule in by_op.get(op.name, []):
            if rule.lhs.op != op.name:
                continue
            ml = rule.match(op)
            if ml is None or rule.reject_reason(ml) is not None:
                continue
            root = op.results[rule.lhs.result]
            if is_exact(rule) and set(leaves(rule.rhs)) <= set(leaves(rule.lhs)):
                # the lhs alone determines the instance: a proved equality wherever it matches
                found.append(Approx(rule, root, ml, value_loc(root)))
                continue
            other = by_name.get(root.name)
            if other is None or other.owner is None or other.owner.name == op.name:
                continue
            if op.origin and other.owner.origin and op.origin != other.owner.origin:
                continue
            mr = _rhs_match(rule, other, keep)
            if mr is None:
                continue
            m = Match(dict(mr.values), dict(mr.consts), dict(mr.attrs))
            m.values.update(ml.values)  # the lhs's leaves are the original's values
            m.consts.update(ml.consts)
            m.attrs.update(ml.attrs)
            found.append(Approx(rule, root, m, value_loc(root)))
            break
    return found


# -- local bounds and preconditions --------------------------------------------------------------


def _concrete(a: Approx, rb: eb.Ranges, ra: eb.Ranges) -> dict[str, Any]:
    out = {}
    for leaf, v in a.match.values.items():
        x = rb.arr.get(id(v), ra.arr.get(id(v)))
        if x is not None:
            out[leaf] = x
    return out


def precondition(a: Approx, rb: eb.Ranges, ra: eb.Ranges) -> tuple[str, str] | None:
    """The instance's numeric precondition: None when it holds, else (kind, reason) with kind
    `fails` (shown false on the concrete weights: a counterexample) or `unchecked` (a leaf is a
    run-time value: the check ran on its interval's endpoints and could not show it holds)."""
    check = getattr(a.rule, "numeric_check", None)
    arrays = _concrete(a, rb, ra)
    if check is not None:
        try:  # on the concrete leaves alone: a reason here is a counterexample
            res = check(arrays)
        except (KeyError, IndexError, TypeError, ValueError):  # it needs a run-time value
            res = None
        else:
            return ("fails", res) if isinstance(res, str) else None
        stand_ins = {}
        for leaf, v in a.match.values.items():
            if leaf not in arrays:
                lo, hi = rb.iv.get(id(v), ra.iv.get(id(v), (-math.inf, math.inf)))
                # the endpoints, and 0 where the range straddles it: the extremes of |x| too
                pts = [lo, hi] + ([0.0] if lo <= 0.0 <= hi else [])
                stand_ins[leaf] = np.array(pts, np.float64)
        try:
            res = check({**arrays, **stand_ins})
        except Exception as exc:  # noqa: BLE001 - a check that needs a concrete value
            res = f"it needs concrete values ({type(exc).__name__}: {exc})"
        if not isinstance(res, str):
            return None
        names = ", ".join(f"%{a.match.values[k].name}" for k in sorted(stand_ins))
        return "unchecked", f"{res} (over the range of the run-time value(s) {names})"
    if _is_quant(a.rule):
        for w, p in _quant_pairs(a.rule):
            _, why = _quant_half(a, arrays, w, p)
            if why is not None:
                return "fails", why
    return None


def _is_quant(rule: Rule) -> bool:
    return rule.name.startswith("quantize-weights-")


def _quant_pairs(rule: Rule) -> list[tuple[str, str]]:
    """(float weight leaf, prefix of its codes/scales/zero-point leaves) of a quantize rule."""
    if rule.lhs.op == "llm.gated_mlp":
        return [("wg", "g"), ("wu", "u"), ("wd", "d")]
    return [("w", "w")]


def _quant_half(
    a: Approx, arrays: dict[str, Any], w: str, p: str
) -> tuple[np.ndarray | None, str | None]:
    if w not in arrays or f"{p}q" not in arrays or f"{p}s" not in arrays:
        return None, f"the weights of {w} are not constants of the module"
    half, why = eb.quant_weight_error(
        arrays[w],
        arrays[f"{p}q"],
        arrays[f"{p}s"],
        arrays.get(f"{p}z"),
        kn=a.rule.name.endswith("-kn"),
    )
    return half, why


def local_bound(a: Approx, rb: eb.Ranges, ra: eb.Ranges, err: Any) -> tuple[float, str]:
    """(bound on |rhs - lhs| at the instance's leaves widened by their errors, where it comes
    from): the rule's own `bound`, else the fallback for its family, else inf."""
    op = a.root.owner
    assert op is not None
    bound = getattr(a.rule, "bound", None)
    wide = {leaf: eb._widen(rb.range(v), err(v)) for leaf, v in a.match.values.items()}
    if bound is not None:
        return _rule_bound(a, bound, rb, ra, wide, err), "the rule's proved bound"
    if _is_quant(a.rule):
        return _quant_bound(a, rb, ra, wide, op), "fallback: |w - q*s| <= s/2 per weight"
    if a.rule.name.startswith("precision-"):
        return _precision_bound(a, rb, wide, op), "fallback: rounding to the target type"
    return math.inf, "no bound: the rule states none and has no fallback"


def _rule_bound(
    a: Approx, bound: Any, rb: eb.Ranges, ra: eb.Ranges, wide: dict[str, eb.Iv], err: Any
) -> float:
    """abs + rel * max magnitude; magnitude None is |lhs| (its range plus the propagated error),
    else the rule's magnitude term evaluated with concrete leaves as they are and every other
    leaf at its largest absolute value (magnitude terms are monotone in |leaves|)."""
    if not bound.rel:
        return float(bound.abs)
    if bound.magnitude is None:
        mag = eb._absmax(rb.range(a.root)) + err(a.root)
    else:
        mag = _magnitude(a, bound.magnitude, rb, ra, wide)
    return float(bound.abs) + float(bound.rel) * mag


def _magnitude(a: Approx, term: Any, rb: eb.Ranges, ra: eb.Ranges, wide: dict[str, eb.Iv]) -> float:
    from llmir_core.interp import Interpreter

    arrays = _concrete(a, rb, ra)
    names = list(leaves(term))
    args, inputs = [], {}
    for leaf in names:
        v = a.match.values.get(leaf)
        if v is None:
            return math.inf
        t = v.type
        x = arrays.get(leaf)
        if x is None:
            if not isinstance(t, TensorType):
                return math.inf
            shape = tuple(d if isinstance(d, int) else 1 for d in t.shape)
            top = eb._absmax(wide.get(leaf, (-math.inf, math.inf)))
            if math.isinf(top):
                return math.inf
            x = np.full(
                shape, top, dtype=t.dtype.to_numpy() if isinstance(t.dtype, DType) else None
            )
            t = TensorType(shape, t.dtype)
        args.append(Value(leaf, t))
        inputs[leaf] = x
    fn = Function("magnitude", args)
    m = Match(
        {leaf: arg for leaf, arg in zip(names, args)}, dict(a.match.consts), dict(a.match.attrs)
    )
    fn.outputs = [build(term, m, Builder(fn))]
    mod = Module(functions=[fn])
    try:
        out = Interpreter(mod, check_types=False).run(inputs)[0]
    except Exception:  # noqa: BLE001 - not evaluable: no bound
        return math.inf
    return float(np.max(np.abs(np.asarray(out, np.float64)), initial=0.0))


def _quant_bound(a: Approx, rb: eb.Ranges, ra: eb.Ranges, wide: dict[str, eb.Iv], op: Op) -> float:
    arrays = _concrete(a, rb, ra)
    halves = {}
    for w, p in _quant_pairs(a.rule):
        half, why = _quant_half(a, arrays, w, p)
        if half is None or why is not None:
            return math.inf
        halves[w] = half
    x = wide.get("x", (-math.inf, math.inf))
    if a.rule.lhs.op == "core.matmul":
        kn = a.rule.name.endswith("-kn")
        return eb._absmax(x) * eb.row_norm(halves["w"], transpose_b=not kn)
    werr = {1: halves["wg"], 2: halves["wu"], 3: halves["wd"]}
    ivs = [x] + [rb.range(v) for v in op.operands[1:]]
    return eb.gated_mlp_err(op, [0.0] * len(ivs), ivs, rb, werr)


def _precision_bound(a: Approx, rb: eb.Ranges, wide: dict[str, eb.Iv], op: Op) -> float:
    targets = [v for k, v in a.match.attrs.items() if k.startswith("__to")]
    us = [UNIT_ROUNDOFF.get(str(t), 0.0) for t in targets] or [0.0]
    u = max(us)
    narrow = next((t for t in targets if str(t) in UNIT_ROUNDOFF and str(t) != "f32"), None)
    errs = []
    for v in op.operands:
        t = v.type
        is_float = isinstance(t, TensorType) and isinstance(t.dtype, DType) and t.dtype.is_float
        c = rb.value(v)
        if c is not None and is_float:  # a constant operand: its rounding, exactly
            errs.append(_rounding_of(c, narrow))
            continue
        leaf_iv = next((wide[k] for k, x in a.match.values.items() if x is v and k in wide), None)
        iv = leaf_iv if leaf_iv is not None else rb.range(v)
        errs.append(u * eb._absmax(iv) if is_float else 0.0)
    inputs, _ = eb.op_error(op, errs, rb) if any(errs) else (0.0, "")
    k = eb._k(op) if op.name in _MATMULS or op.name == "llm.scaled_dot_product_attention" else 0
    if k:  # the sum of |terms| of a contraction: its range over operands symmetric about 0
        sym = [(-eb._absmax(rb.range(v)), eb._absmax(rb.range(v))) for v in op.operands]
        terms = eb._absmax(eb.op_range(op, sym))
    else:  # an elementwise or data-movement op: its result
        terms = eb._absmax(rb.range(a.root)) + inputs
    out = inputs + (k + 1) * u * terms
    if op.name == "llm.scaled_dot_product_attention":  # scores rounded: see error_bounds
        out += eb._attention(
            op,
            [u * eb._absmax(rb.range(v)) for v in op.operands[:3]],
            [rb.range(v) for v in op.operands],
            rb,
        )
    return out


def _rounding_of(c: np.ndarray, dtype: Any) -> float:
    """max |fl(c) - c| for a concrete operand rounded to `dtype` (f16 exactly, bf16 by its u)."""
    if dtype is None or c.size == 0:
        return 0.0
    if str(dtype) == "f16":
        return float(np.max(np.abs(c.astype(np.float16).astype(np.float64) - c)))
    return UNIT_ROUNDOFF.get(str(dtype), 0.0) * float(np.max(np.abs(c)))
