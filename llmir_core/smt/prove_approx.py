"""Proofs of approximate rules: `|rhs - lhs| <= abs + rel * magnitude` about the rule's own terms.

Runs in the solver child (imports z3 at the top). Both sides and the bound's magnitude are
encoded from the rule's terms at a symbolic index, with rounding made explicit:

- **Rounding model** (the standard real model): rounding a value x to a narrower float is
  `x (1 + d(x)) + e(x)` with `|d| <= U = 2^-8` and `|e| <= H = 2^-25`, `d`, `e` uninterpreted
  functions of the value (rounding is a function), bounded by ground hypotheses at each use. One
  model covers every target float: bf16 (u = 2^-8, half subnormal spacing 2^-134), f16 (2^-11,
  2^-25) and f32 (2^-24, 2^-150). The rounded value is assumed finite (overflow is what
  `llmir verify --ranges` checks). Rounding a value already representable in the target dtype is
  the identity; widening casts (to f32, from integers) are exact.
- **Where rounding happens**: at a cast to the narrow dtype `D` (assign-precision's `__to`) or
  back to the original dtype `O` (`__back`, f32 or narrower), and at the result of every
  arithmetic op whose operands are in `D` (the op computes its exact real result, then rounds
  to D; sums accumulate exactly: the f32 accumulator's error is not modelled). Data movement
  (reshape, transpose, slice, concat, gather, tile, reduce_max, neg, relu, abs, max/min) does
  not round. The unrounded source (f32) computation is the reference: its own rounding is not
  charged to the rewrite.
- **Ops without fixed attributes**: a data-movement op whose attributes are pattern variables
  is encoded generically (each result element is a copy of an element of an operand, at an
  uninterpreted index map), so the proof holds for every attribute value; the f32-class ops
  (norms, softmax, exp, ...) are uninterpreted functions of their operand tensors (as z3 arrays),
  so equal operands give equal results, whatever the op computes.
- **Reductions** with a symbolic length: the per-term bound `|b_k - a_k| <= rho * c_k + eta` is
  proved at a fresh index k, then lifted by its ground lemma instance (`|Sum b - Sum a| <= rho *
  Sum c + n * eta`; for max, `|Max b - Max a| <= rho * Max c + eta`), `rho` the smallest of a
  few candidates that proves. The final query contains lhs and rhs encoded from the terms.
- **Facts about functions**: sigmoid is in (0, 1) and 1/4-Lipschitz, silu 1.1-Lipschitz, gelu
  1.13-Lipschitz with |gelu(x)| <= |x|, tanh 1-Lipschitz with |tanh(x)| <= |x|; `round(t)` is
  an integer within 1/2 of t; a cast to an integer dtype of an integer in range is exact; a max
  is at least each of its terms. All as ground instances at the terms that occur.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import z3

from llmir_core.rewrite.bounds import ROUND_H, ROUND_U
from llmir_core.rewrite.rule import Rule
from llmir_core.rewrite.terms import A, C, K, T, Term, V, leaves

from .semantics import CodesTensor, EncodeError, Encoder, STensor

U, H = ROUND_U, ROUND_H

NARROW, ORIGINAL = "D", "O"
WIDE = ("f32", "f64")
MOVE = frozenset(
    {
        "core.reshape",
        "core.transpose",
        "core.slice",
        "core.unsqueeze",
        "core.squeeze",
        "core.tile",
        "core.gather",
        "core.concat",
        "core.reduce_max",
    }
)
EXACT_IN_LOW = MOVE | {
    "core.neg",
    "core.abs",
    "core.relu",
    "core.max",
    "core.min",
    "core.where",
    "core.identity",
    "llm.to_device",
}
# computed in f32 by assign-precision: uninterpreted functions of their operand tensors
OPAQUE = frozenset(
    {
        "llm.rms_norm",
        "llm.add_rms_norm",
        "llm.layer_norm",
        "core.softmax",
        "core.log_softmax",
        "core.reduce_mean",
        "core.reduce_sum",
        "core.exp",
        "core.log",
        "core.pow",
        "core.sqrt",
        "core.rsqrt",
        "llm.rotary_embedding",
        "llm.embedding",
    }
)
LIPSCHITZ = {"sigmoid": 0.25, "gelu_none": 1.13, "gelu_tanh": 1.13, "tanh": 1.0}
RHO = tuple((1 + U) ** j - 1 for j in range(1, 5)) + (0.5, 1.0)
ETA = (0.0, 2 * H, 4 * H)
# tried in this order (the per-term bound of a product of two rounded values first): the first
# that proves is lifted
CANDIDATES = [(RHO[1], 0.0)] + [(r, e) for e in ETA for r in RHO if (r, e) != (RHO[1], 0.0)]


def real(x: float) -> Any:
    f = Fraction(x)
    return z3.RealVal(f"{f.numerator}/{f.denominator}")


def zabs(x: Any) -> Any:
    return z3.If(x >= 0, x, -x)


def _is_int_dtype(dt: str) -> bool:
    return dt[:1] in ("i", "u") and dt != "D"


class ApproxEncoder(Encoder):
    """The base encoder plus rounding, quantized matmul and the ground facts of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.app_lemma: dict[str, Callable[[Any], list[Any]]] = {}
        self._n = 0
        self.case: dict[str, Any] = {}  # the attribute case being proved (premises read it)

    def fresh_fn(self, base: str, *sorts: Any) -> Any:
        self._n += 1
        return z3.Function(f"{base}!{self._n}", *sorts)

    def bounded(self, name: str, arity: int, radius: Callable[[Any], Any]) -> Any:
        """An uninterpreted function whose every application is bounded by `radius(app)`."""
        f = z3.Function(name, *([self.R] * arity), self.R) if arity else None
        self.app_lemma[name] = lambda app: [zabs(app) <= radius(app)]
        return f

    def rounding(self, kind: str) -> Callable[[Any], Any]:
        """x (1 + d) + e, |d| <= U, |e| <= H, in its equivalent additive form x + err(x) with
        |err(x)| <= U |x| + H (linear in x, so z3 stays in linear arithmetic where it can)."""
        err = z3.Function(f"rerr_{kind}", self.R, self.R)
        self.app_lemma[f"rerr_{kind}"] = lambda app: [
            zabs(app) <= real(U) * zabs(app.arg(0)) + real(H)
        ]
        return lambda x: x + err(x)

    # -- quantized weights: codes q [n, k], scales and zero points [n, g] per block -------------
    def block_of(self, groups: Any) -> Any:
        blk = z3.Function("blk", self.I, self.I)
        self.app_lemma["blk"] = lambda app: [0 <= app, app < groups]
        return blk

    def dequant(self, q: STensor, s: STensor, z: STensor | None) -> STensor:
        if q.rank != 2 or s.rank != 2:
            raise EncodeError("quantized weights are encoded as [n, k] codes with [n, g] scales")
        blk = self.block_of(s.shape[1])

        def f(i: Any) -> Any:
            n, k = i
            zero = z.f((n, blk(k))) if z is not None else 0
            return (q.f((n, k)) - zero) * s.f((n, blk(k)))

        return STensor(q.shape, f)

    def op(
        self, name: str, args: Any, attrs: dict[str, Any], leaf_dtype: str = "f32"
    ) -> list[STensor]:
        if name in ("llm.dequantize", "llm.quantized_matmul") and any(
            isinstance(a, CodesTensor) and a.qtype is not None for a in args[:2]
        ):  # codes of a known layout (llm.quantize's): the op's own meaning (llm_smt)
            return super().op(name, args, attrs, leaf_dtype)
        if name == "llm.dequantize" and len(args) >= 2:
            return [self.dequant(args[0], args[1], args[2] if len(args) > 2 else None)]
        if name == "llm.quantized_matmul" and len(args) >= 3:
            w = self.dequant(args[1], args[2], args[3] if len(args) > 3 else None)
            return [self.matmul(args[0], w, transpose_b=bool(attrs.get("transpose_b", True)))]
        return super().op(name, args, attrs, leaf_dtype)


# -- the ground facts: a walk over the applications that occur -------------------------------


def _apps(exprs: list[Any]) -> list[Any]:
    seen: set[int] = set()
    out: list[Any] = []
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_quantifier(e):
            continue
        if z3.is_app(e):
            if e.num_args() and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
                out.append(e)
            stack.extend(e.children())
    return out


def _var0_positions(body: Any) -> list[tuple[Any, int]]:
    """(function, argument position) where a reduction body reads the bound index directly."""
    out: list[tuple[Any, int]] = []
    for app in _apps([body]):
        for p, a in enumerate(app.children()):
            if z3.is_var(a) and z3.get_var_index(a) == 0:
                out.append((app.decl(), p))
    return out


def _body_apps(body: Any) -> list[Any]:
    """Applications inside a lambda body (it may read the bound index)."""
    out: list[Any] = []
    stack, seen = [body], set()
    while stack:
        e = stack.pop()
        if e.get_id() in seen or z3.is_quantifier(e):
            continue
        seen.add(e.get_id())
        if z3.is_app(e):
            if e.num_args() and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
                out.append(e)
            stack.extend(e.children())
    return out


def facts(enc: ApproxEncoder, exprs: list[Any], rounds: int = 3) -> list[Any]:
    """Ground lemma instances for the applications in `exprs` (to a small fixed point)."""
    lemmas: list[Any] = []
    done: set[int] = set()
    pool = list(exprs)
    for _ in range(rounds):
        apps = _apps(pool)
        new: list[Any] = []
        by_name: dict[str, list[Any]] = {}
        for app in apps:
            name = app.decl().name()
            by_name.setdefault(name, []).append(app)
            if app.get_id() in done:
                continue
            done.add(app.get_id())
            base = name.split("!")[0]
            if name in enc.app_lemma:
                new += enc.app_lemma[name](app)
            elif base == "sigmoid":  # and |silu(p)| = |p sigmoid(p)| <= |p|
                p = app.arg(0)
                new.append(z3.And(app > 0, app < 1, zabs(p * app) <= zabs(p)))
            elif base in ("gelu_none", "gelu_tanh", "tanh"):
                new.append(zabs(app) <= zabs(app.arg(0)))
            elif base == "round":
                t = app.arg(0)
                new += [zabs(app - t) <= real(0.5), z3.ToReal(z3.ToInt(app)) == app]
            elif base == "MaxR":
                n, lam = app.arg(0), app.arg(1)
                body = lam.body()
                for decl, pos in _var0_positions(body):
                    for other in apps:
                        if other.decl().eq(decl) and other.num_args() > pos:
                            j = other.arg(pos)
                            new.append(
                                z3.Implies(
                                    z3.And(0 <= j, j < n), app >= z3.substitute_vars(body, j)
                                )
                            )
        for name, group in by_name.items():
            base = name.split("!")[0]
            if base in LIPSCHITZ and len(group) > 1:
                lip = real(LIPSCHITZ[base])
                for p, q in _pairs(group):
                    new.append(zabs(p - q) <= lip * zabs(p.arg(0) - q.arg(0)))
                    if base == "sigmoid":  # silu(x) = x sigmoid(x) is 1.1-Lipschitz
                        x, y = p.arg(0), q.arg(0)
                        new.append(zabs(x * p - y * q) <= real(1.1) * zabs(x - y))
        new = [f for f in new if not any(f.eq(g) for g in lemmas)]
        if not new:
            break
        lemmas += new
        pool = new
    return lemmas


def _pairs(xs: list[Any]) -> list[tuple[Any, Any]]:
    return [(xs[i], xs[j]) for i in range(len(xs)) for j in range(i + 1, len(xs))]


# -- encoding a rule's terms ------------------------------------------------------------------


class Side:
    """An encoded term: tensor, precision class (`src`, `low`, `int`), representable dtypes."""

    def __init__(self, t: STensor, cls: str, reps: frozenset[str]) -> None:
        self.t, self.cls, self.reps = t, cls, reps


class RuleEncoding:
    def __init__(self, rule: Rule, batch: int, case: dict[str, Any]) -> None:
        from .prove import dim_names

        self.rule, self.enc = rule, ApproxEncoder()
        self.dims: dict[str, Any] = {}
        self.syms: dict[str, Any] = {}
        self.case = case
        self.round = {k: self.enc.rounding(k) for k in (NARROW, ORIGINAL, "f16", "bf16")}
        leaf_defs = leaves(rule.lhs)
        leaves(rule.rhs, leaf_defs)
        if rule.bound is not None and rule.bound.magnitude is not None:
            leaves(rule.bound.magnitude, leaf_defs)
        for name in case.get("__sig__", rule.sig):  # leaves the premise reads
            leaf_defs.setdefault(name, V(name))
        tensors: dict[str, STensor] = {}
        for name, leaf in leaf_defs.items():
            if isinstance(leaf, C):
                self.syms[name] = z3.Real(name)
                tensors[name] = STensor((), (lambda s: lambda i: s)(self.syms[name]))
                continue
            names = dim_names(case.get("__sig__", rule.sig).get(name, ""), batch)
            shape = tuple(self.dims.setdefault(n, z3.Int(n)) for n in names)
            fn = (
                z3.Function(name, *([z3.IntSort()] * len(names)), z3.RealSort())
                if names
                else z3.Real(name)
            )
            tensors[name] = STensor(
                shape, (lambda f, r: (lambda i: f(*i)) if r else (lambda i: f))(fn, len(names))
            )
        self.enc.case = case
        if rule.premise is not None:
            tensors.update(rule.premise(self.enc, tensors, self.dims))
        self.leaves: dict[str, Side] = {}
        for name, tt in tensors.items():
            dt = rule.dtypes.get(name, "f32")
            if _is_int_dtype(dt):
                self.leaves[name] = Side(tt, "int", frozenset({dt}))
            else:
                self.leaves[name] = Side(tt, "src", frozenset({dt, "f32", "f64"}))
        self.cache: dict[int, list[Side]] = {}

    def resolve(self, v: Any) -> Any:
        if isinstance(v, A):
            if v.name in self.case:
                return self.resolve(self.case[v.name])
            if v.name in self.syms:
                return self.syms[v.name]
            return v
        if isinstance(v, tuple):
            return tuple(self.resolve(x) for x in v)
        if isinstance(v, str) and v in self.dims:
            return self.dims[v]
        return v

    def encode(self, term: Term) -> Side:
        if isinstance(term, (V, C)):
            return self.leaves[term.name]
        if isinstance(term, K):
            c = real(term.value)
            return Side(STensor((), lambda i: c), "src", frozenset({"f32", "f64"}))
        assert isinstance(term, T)
        if id(term) not in self.cache:
            args = [self.encode(a) for a in term.args]
            at = {k: self.resolve(v) for k, v in term.attrs.items()}
            self.cache[id(term)] = self._op(term, args, at)
        return self.cache[id(term)][term.result]

    def _op(self, term: T, args: list[Side], at: dict[str, Any]) -> list[Side]:
        if term.op == "core.cast":
            return [self._cast(args[0], str(at["to"]) if not isinstance(at["to"], A) else "?")]
        floats = [a for a in args if a.cls != "int"]
        low = any(a.cls == "low" for a in floats)
        cls = "low" if low else ("src" if floats or not args else "int")
        reps = frozenset.intersection(*[a.reps for a in floats]) if floats else frozenset()
        unbound = [k for k, v in at.items() if isinstance(v, A) or _has_a(v)]
        key = f"{term.op}|{sorted((k, repr(v)) for k, v in term.attrs.items())}"
        if term.op in OPAQUE and not (term.op == "llm.embedding" and not low):
            outs = self._opaque(term, key, args)
        elif term.op in MOVE and unbound:
            outs = [self._move(term, key, args)]
        else:
            if unbound:
                raise EncodeError(f"{term.op}: attribute {unbound[0]} is not bound by a proof case")
            outs = self.enc.op(term.op, [a.t for a in args], at)
        if not low or term.op in EXACT_IN_LOW:
            return [Side(o, cls, reps) for o in outs]
        r = self.round[NARROW]
        return [Side(_mapped(o, r), "low", frozenset({NARROW})) for o in outs]

    def _cast(self, x: Side, to: str) -> Side:
        if to == "?":
            raise EncodeError("a cast's target dtype is not bound by a proof case")
        if _is_int_dtype(to):
            if x.cls == "int":
                return x
            bits = int("".join(ch for ch in to if ch.isdigit()) or "64")
            lo, hi = (
                (0, 2**bits - 1)
                if to.startswith("u")
                else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            )
            f = z3.Function(f"castint_{to}_{lo}_{hi}".replace("-", "m"), self.enc.R, self.enc.R)
            name = f.name()
            self.enc.app_lemma[name] = lambda app: [
                z3.Implies(
                    z3.And(
                        z3.ToReal(z3.ToInt(app.arg(0))) == app.arg(0),
                        lo <= app.arg(0),
                        app.arg(0) <= hi,
                    ),
                    app == app.arg(0),
                )
            ]
            return Side(STensor(x.t.shape, lambda i: f(x.t.f(i))), "int", frozenset({to}))
        if x.cls == "int":
            return Side(x.t, "src", frozenset({"f32", "f64", to}))
        if to in x.reps or to in WIDE:
            cls = "src" if to in WIDE or to == ORIGINAL else "low"
            return Side(x.t, cls, x.reps | {to})
        r = self.round[to if to in self.round else NARROW]
        return Side(
            STensor(x.t.shape, lambda i: r(x.t.f(i))),
            "src" if to == ORIGINAL else "low",
            frozenset({to}),
        )

    def _flat(self, key: str) -> Any:
        return self.dims.setdefault(f"N[{key}]", z3.Int(f"N[{key}]"))

    def _index_map(self, key: str, x: STensor, extra: tuple[Any, ...] = ()) -> Callable[[Any], Any]:
        sorts = [z3.IntSort()] * (1 + len(extra))
        maps = [z3.Function(f"pi[{key}]{d}", *sorts, z3.IntSort()) for d in range(x.rank)]
        return lambda j: tuple(m(j, *extra) for m in maps)

    def _arr(self, x: STensor) -> Any:
        if x.rank == 0:
            return x.f(())
        ks = [z3.Int(f"arr{d}") for d in range(x.rank)]
        return z3.Lambda(ks, x.f(tuple(ks)))

    def _move(self, term: T, key: str, args: list[Side]) -> STensor:
        """A data-movement op with symbolic attributes: each result element copies an element of
        an operand (for reduce_max, the max of some of them) at an uninterpreted index map."""
        n = self._flat(key)
        xs = [a.t for a in args if a.cls != "int"] or [args[0].t]
        ints = tuple(self._arr(a.t) for a in args if a.cls == "int" and a.t is not xs[0])
        if term.op == "core.reduce_max":
            x = xs[0]
            length = self.dims.setdefault(f"L[{key}]", z3.Int(f"L[{key}]"))
            maps = [
                z3.Function(f"pi[{key}]{d}", z3.IntSort(), z3.IntSort(), z3.IntSort())
                for d in range(x.rank)
            ]
            return STensor(
                (n,),
                lambda i: self.enc.reduction(
                    "max", length, lambda k: x.f(tuple(m(i[0], k) for m in maps))
                ),
            )
        if ints:  # gather: where an element comes from depends on the index tensor
            sort = [z3.IntSort()] + [a.sort() for a in ints]
            maps = [z3.Function(f"pi[{key}]{d}", *sort, z3.IntSort()) for d in range(xs[0].rank)]
            x0 = xs[0]
            return STensor((n,), lambda i: x0.f(tuple(m(i[0], *ints) for m in maps)))
        pis = [self._index_map(f"{key}#{p}", x) for p, x in enumerate(xs)]
        sel = z3.Function(f"sel[{key}]", z3.IntSort(), z3.IntSort())

        def f(i: Any) -> Any:
            out = xs[-1].f(pis[-1](i[0]))
            for p in range(len(xs) - 2, -1, -1):
                out = z3.If(sel(i[0]) == p, xs[p].f(pis[p](i[0])), out)
            return out

        return STensor((n,), f)

    def _opaque(self, term: T, key: str, args: list[Side]) -> list[STensor]:
        """An op computed in f32 read as a function of its operand tensors (z3 arrays)."""
        from llmir_core.dialects.registry import get_op

        od = get_op(term.op)
        nres = len(od.results) if od is not None else 1
        arrs = [self._arr(a.t) for a in args]
        n = self._flat(key)
        outs = []
        for r in range(max(nres, term.result + 1)):
            g = z3.Function(f"op[{key}]{r}", z3.IntSort(), *[a.sort() for a in arrs], z3.RealSort())
            outs.append(_applied(n, g, arrs))
        return outs


def _mapped(x: STensor, fn: Callable[[Any], Any]) -> STensor:
    return STensor(x.shape, lambda i: fn(x.f(i)))


def _applied(n: Any, g: Any, arrs: list[Any]) -> STensor:
    return STensor((n,), lambda i: g(i[0], *arrs))


def _has_a(v: Any) -> bool:
    if isinstance(v, A):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_a(x) for x in v)
    return False


# -- the proof ----------------------------------------------------------------------------------


def _reductions(exprs: list[Any]) -> list[Any]:
    return [a for a in _apps(exprs) if a.decl().name() in ("Sum", "MaxR")]


def _lift(
    enc: ApproxEncoder, base: list[Any], a: Any, b: Any, c: Any, limit_ms: int
) -> tuple[Any, str, bool]:
    """Prove |b_k - a_k| <= rho c_k + eta at a fresh k; return the lifted ground lemma (None
    when no candidate proves), its note, and whether a sub-query was undecided."""
    n = a.arg(0)
    k = z3.Int(f"lift!{a.get_id()}!{b.get_id()}")
    ak, bk, ck = (z3.substitute_vars(e.arg(1).body(), k) for e in (a, b, c))
    hyps = base + [0 <= k, k < n] + facts(enc, [ak, bk, ck])
    is_sum = a.decl().name() == "Sum"
    undecided = False

    def holds(goal: Any) -> bool:
        nonlocal undecided
        s = z3.Solver()
        s.set("timeout", limit_ms)
        s.add(hyps)
        s.add(z3.Not(goal))
        r = s.check()
        undecided |= r == z3.unknown
        return r == z3.unsat

    for rho, eta in CANDIDATES:
        if holds(z3.And(ck >= 0, zabs(bk - ak) <= real(rho) * ck + real(eta))):
            slack = real(eta) * z3.ToReal(n) if is_sum else real(eta)
            lemma = z3.And(zabs(b - a) <= real(rho) * c + slack, c >= 0)
            if holds(zabs(ak) <= ck):  # then |Sum a| <= Sum c and |Max a| <= Max c too
                lemma = z3.And(lemma, zabs(a) <= c)
            return lemma, f"per-term |b-a| <= {rho:.3g} c + {eta:.3g}", undecided
    return None, "", undecided


def prove_case(rule: Rule, batch: int, case: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """One attribute case at one batch rank: unsat (the bound holds), sat or unknown."""
    assert rule.bound is not None
    try:
        re = RuleEncoding(rule, batch, case)
        lhs, rhs = re.encode(rule.lhs), re.encode(rule.rhs)
        mag = re.encode(rule.bound.magnitude) if rule.bound.magnitude is not None else None
    except (EncodeError, KeyError, TypeError, IndexError, ValueError, z3.Z3Exception) as exc:
        return {"verdict": "unknown", "reason": f"no encoding: {exc}"}
    if lhs.t.rank != rhs.t.rank:
        return {
            "verdict": "sat",
            "reason": f"ranks differ: {lhs.t.rank} vs {rhs.t.rank}",
            "model": None,
        }
    idx = tuple(z3.Int(f"i{j}") for j in range(lhs.t.rank))
    try:
        lv, rv, mv = _elements(lhs, rhs, mag, idx)
    except (EncodeError, KeyError, TypeError, IndexError, z3.Z3Exception) as exc:
        return {"verdict": "unknown", "reason": f"no encoding: {exc}"}
    enc = re.enc
    base = [d >= 1 for d in re.dims.values()]
    base += [z3.And(0 <= i, i < d) for i, d in zip(idx, lhs.t.shape)]
    if rule.assume is not None:
        base += rule.assume({**re.syms, **re.dims})
    lifted = _Lifted(enc, base, lv, rv, mv, max(500, int(limit_s * 1000 / 2)))
    s = z3.Solver()
    s.set("timeout", int(limit_s * 1000))
    s.add(base)  # the dims, the index and the rule's assumptions (the facts are true of the model)
    if s.check() == z3.unsat:
        return {"verdict": "vacuous", "reason": "the hypotheses cannot hold"}
    s.add(facts(enc, [lv, rv, mv] + lifted.lemmas))
    s.add(lifted.lemmas)
    same_shape = [
        z3.BoolVal(a == b) if isinstance(a, int) and isinstance(b, int) else (a == b)
        for a, b in zip(lhs.t.shape, rhs.t.shape)
    ]
    bound = real(rule.bound.abs) + real(rule.bound.rel) * mv
    s.add(z3.Not(z3.And(*same_shape, zabs(rv - lv) <= bound)))
    r = s.check()
    if r == z3.unsat:
        return {"verdict": "unsat", "lifts": lifted.notes}
    if r == z3.unknown:
        return {"verdict": "unknown", "reason": s.reason_unknown()}
    model = _model_values(s.model(), re, lv, rv, bound)
    why = "the bound fails in the rounding model"
    spurious = lifted.unlifted or lifted.incomplete
    if spurious:
        why += " (a reduction's per-term bound was not shown: the model may be spurious)"
    return {"verdict": "unlifted" if spurious else "sat", "reason": why, "model": model}


def _elements(lhs: Any, rhs: Any, mag: Any, idx: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """The two sides' element at `idx`, and the magnitude the relative bound scales (|lhs|
    unless the rule names one, broadcast against idx), simplified."""
    lv, rv = lhs.t.f(idx), rhs.t.f(idx)
    if mag is None:
        mv = zabs(lv)
    else:
        off = lhs.t.rank - mag.t.rank
        mi = tuple(
            0 if isinstance(d, int) and d == 1 else idx[j + off] for j, d in enumerate(mag.t.shape)
        )
        mv = mag.t.f(mi)
    lv, rv, mv = (
        z3.simplify(e) if not isinstance(e, (int, float)) else real(e) for e in (lv, rv, mv)
    )
    return lv, rv, mv


class _Lifted:
    """Per-term lemmas for the reductions of the right side that the left side also reduces
    (same function, same range) and the magnitude bounds: `lemmas`, their `notes`, how many
    reductions stayed `unlifted`, and whether a lifting sub-query was undecided (`incomplete`:
    then a sat answer may be spurious)."""

    def __init__(self, enc: Any, base: list[Any], lv: Any, rv: Any, mv: Any, limit_ms: int) -> None:
        self.lemmas: list[Any] = []
        self.notes: list[str] = []
        self.unlifted = 0
        self.incomplete = False
        left = _reductions([lv])
        right = [r for r in _reductions([rv]) if not any(r.eq(x) for x in left)]
        mags = _reductions([mv])
        for b in right:
            self.unlifted += not self._lift_one(enc, base, left, b, mags, limit_ms)

    def _lift_one(
        self, enc: Any, base: list[Any], left: list[Any], b: Any, mags: list[Any], limit_ms: int
    ) -> bool:
        for a in left:
            if not (a.decl().eq(b.decl()) and a.arg(0).eq(b.arg(0))):
                continue
            for c in mags:
                if not (c.decl().eq(b.decl()) and c.arg(0).eq(b.arg(0))):
                    continue
                lemma, note, undecided = _lift(enc, base, a, b, c, limit_ms)
                self.incomplete |= undecided
                if lemma is not None:
                    self.lemmas.append(lemma)
                    self.notes.append(note)
                    return True
        return False


def _model_values(m: Any, re: Any, lv: Any, rv: Any, bound: Any) -> dict[str, Any]:
    """A counterexample's dims, the two sides, the bound and the constants, as floats."""

    def num(e: Any) -> float:
        v = m.eval(e, model_completion=True)
        try:
            if z3.is_rational_value(v):
                return float(v.numerator_as_long()) / float(v.denominator_as_long())
            if z3.is_int_value(v):
                return float(v.as_long())
            if z3.is_algebraic_value(v):
                return float(v.approx(12).as_decimal(12).rstrip("?"))
        except (ValueError, OverflowError):
            pass
        return float("nan")

    return {
        "dims": {n: num(d) for n, d in re.dims.items() if "[" not in n},
        "lhs": num(lv),
        "rhs": num(rv),
        "bound": num(bound),
        "consts": {n: num(x) for n, x in re.syms.items()},
    }


def approx_job(rule: Rule, limit_s: float) -> dict[str, Any]:
    """Every attribute case at every batch rank; the first that fails decides."""
    cases = rule.proof_cases or ({},)
    lifts: list[str] = []
    for case in cases:
        for batch in rule.batch_ranks:
            res = prove_case(rule, batch, case, limit_s)
            if res["verdict"] != "unsat":
                res["case"] = {k: str(v) for k, v in case.items()}
                res["batch_rank"] = batch
                return res
            lifts += res.get("lifts", [])
    return {"verdict": "unsat", "lifts": sorted(set(lifts))}
