"""Prove rewrite rules: `lhs == rhs` elementwise for all shapes of the given ranks.

For each batch rank in `rule.batch_ranks` the prover builds, in a killable child process, the
element-level encoding of both sides over symbolic dims (Ints >= 1), a symbolic index inside
the result shape, the rule's assumptions and the encoder's ground lemma instances, checks the
assumptions are satisfiable, and asks z3 whether the two sides can differ (or their shapes).

Verdicts: `proved` (unsat), `refuted` (sat, and the counterexample, replayed with numpy through
the reference interpreter, really shows a difference), `spurious` (sat, but neither the model nor
random inputs at its shape show a difference: an artefact of the uninterpreted functions),
`unknown` (z3 gave up or an op has no encoding), `inconclusive` (killed at the time limit),
`vacuous` (the assumptions cannot hold), `unproved` (an approximate rule whose bound could not be
shown, or an obligation not built from the rule's own terms). Approximate rules (`rule.bound`)
prove `|rhs - lhs| <= bound` about their own terms with rounding explicit (`approx`).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmir_core.rewrite.rule import Rule
from llmir_core.rewrite.terms import A, C, K, T, Term, V, leaves

from .solver import run_job

MAX_REPLAY_DIM = 4


class ReplayError(Exception):
    """A side of the rule cannot be run by the reference interpreter (missing op, bad dtype)."""


@dataclass
class RuleVerdict:
    rule: str
    verdict: str
    seconds: float
    tag: str
    method: str = "smt"
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    dtype_checks: dict[str, str] = field(default_factory=dict)
    bound: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "verdict": self.verdict,
            "tag": self.tag,
            "method": self.method,
            "seconds": round(self.seconds, 4),
            "detail": self.detail,
            "counterexample": self.counterexample,
            "dtype_checks": self.dtype_checks,
            "bound": self.bound or None,
        }


def dim_names(sig: str, batch: int) -> list[str]:
    out: list[str] = []
    for tok in sig.split():
        if tok == "...":
            out.extend(f"b{i}" for i in range(batch))
        else:
            out.append(tok)
    return out


def _attrs_for(rule: Rule, batch: int) -> dict[str, Any]:
    return dict(rule.proof_attrs(batch)) if rule.proof_attrs else {}


# -- the child-side job --------------------------------------------------------------------


def _job(rule: Rule, batch: int, limit_s: float) -> dict[str, Any]:
    """In the solver child: is there an input where the rule's two sides differ (in shape or
    in one element)? unsat: proved; sat: the counterexample, read back as arrays to replay."""
    import z3

    from .semantics import EncodeError, Encoder

    enc = Encoder()
    leaf = _Leaves(rule, batch)
    encode = _term_encoder(rule, batch, enc, leaf)
    try:
        lhs, rhs = encode(rule.lhs), encode(rule.rhs)
    except (EncodeError, KeyError, TypeError, IndexError) as exc:
        return {"verdict": "unknown", "reason": f"no encoding: {exc}"}
    if lhs.rank != rhs.rank:
        return {
            "verdict": "sat",
            "reason": f"ranks differ: {lhs.rank} vs {rhs.rank}",
            "model": None,
        }
    idx = tuple(z3.Int(f"i{j}") for j in range(lhs.rank))
    try:
        lv, rv = lhs.f(idx), rhs.f(idx)
    except (EncodeError, KeyError, TypeError, IndexError) as exc:
        return {"verdict": "unknown", "reason": f"no encoding: {exc}"}
    s = z3.Solver()
    s.set("timeout", int(limit_s * 1000))
    s.add([d >= 1 for d in leaf.dims.values()])
    if rule.assume is not None:
        s.add(rule.assume({**leaf.syms, **leaf.dims}))
    s.add(enc.lemmas())
    if s.check() == z3.unsat:
        return {"verdict": "vacuous", "reason": "the rule's assumptions cannot hold"}
    shape_diff = z3.Or(
        [z3.Not(_eq(a, b)) for a, b in zip(lhs.shape, rhs.shape)] or [z3.BoolVal(False)]
    )
    s.add([z3.And(0 <= i, i < d) for i, d in zip(idx, lhs.shape)])
    s.add(z3.Or(shape_diff, lv != rv))
    r = s.check()
    if r == z3.unsat:
        return {"verdict": "unsat"}
    if r == z3.unknown:
        return {"verdict": "unknown", "reason": s.reason_unknown()}
    return {"verdict": "sat", "model": _counterexample(s.model(), leaf)}


class _Leaves:
    """The rule's leaves as z3 terms: a symbolic dim per dim name, a real per constant (`syms`),
    an uninterpreted function per tensor (`funcs`: name -> (function, its dim names)), and
    each leaf's symbolic tensor (`tensors`)."""

    def __init__(self, rule: Rule, batch: int) -> None:
        import z3

        from .semantics import STensor

        self.dims: dict[str, Any] = {}
        self.syms: dict[str, Any] = {}
        self.tensors: dict[str, Any] = {}
        self.funcs: dict[str, Any] = {}
        leaf_defs = leaves(rule.lhs)
        leaves(rule.rhs, leaf_defs)
        for name, leaf in leaf_defs.items():
            if isinstance(leaf, C):
                self.syms[name] = z3.Real(name)
                self.tensors[name] = STensor((), (lambda s: lambda i: s)(self.syms[name]))
                continue
            names = dim_names(rule.sig.get(name, ""), batch)
            shape = tuple(self.dims.setdefault(n, z3.Int(n)) for n in names)
            fn = (
                z3.Function(name, *([z3.IntSort()] * len(names)), z3.RealSort())
                if names
                else z3.Real(name)
            )
            self.funcs[name] = (fn, names)
            self.tensors[name] = STensor(shape, _leaf_fn(fn, len(names)))


def _term_encoder(rule: Rule, batch: int, enc: Any, leaf: _Leaves) -> Any:
    """term -> its symbolic tensor (each op encoded once); attributes resolve to the rule's
    proof attributes, its symbolic constants or its dims."""
    import z3

    from .semantics import STensor

    attrs = _attrs_for(rule, batch)

    def resolve(v: Any) -> Any:
        if isinstance(v, A):
            if v.name in attrs:
                return resolve(attrs[v.name])
            return leaf.syms[v.name]
        if isinstance(v, tuple):
            return tuple(resolve(x) for x in v)
        if isinstance(v, str) and v in leaf.dims:
            return leaf.dims[v]
        return v

    cache: dict[int, list[Any]] = {}

    def encode(term: Term) -> Any:
        if isinstance(term, (V, C)):
            return leaf.tensors[term.name]
        if isinstance(term, K):
            return STensor((), (lambda c: lambda i: c)(z3.RealVal(term.value)))
        assert isinstance(term, T)
        key = id(term)
        if key not in cache:
            args = [encode(a) for a in term.args]
            at = {k: resolve(v) for k, v in term.attrs.items()}
            if term.op == "core.cast" and term.args and isinstance(term.args[0], V):
                at["__from__"] = rule.dtypes.get(term.args[0].name, "f32")
            cache[key] = enc.op(term.op, args, at)
        return cache[key][term.result]

    return encode


def _counterexample(m: Any, leaf: _Leaves) -> dict[str, Any]:
    """The solver's model as replayable data: dims (clamped to 1..MAX_REPLAY_DIM, else 2),
    the solver's own dims, every tensor leaf as nested lists, every constant."""
    import z3

    def num(e: Any) -> float:
        v = m.eval(e, model_completion=True)
        if z3.is_rational_value(v):
            return float(v.numerator_as_long()) / float(v.denominator_as_long())
        if z3.is_algebraic_value(v):
            return float(v.approx(12).as_decimal(12).rstrip("?"))
        if z3.is_int_value(v):
            return float(v.as_long())
        return 0.0

    dim_vals = {n: int(num(d)) for n, d in leaf.dims.items()}
    use = {n: (v if 1 <= v <= MAX_REPLAY_DIM else 2) for n, v in dim_vals.items()}
    arrays: dict[str, Any] = {}
    for name, (fn, names) in leaf.funcs.items():
        shape = tuple(use[n] for n in names)
        arr = np.zeros(shape)
        for ix in itertools.product(*(range(n) for n in shape)):
            arr[ix] = num(fn(*[z3.IntVal(i) for i in ix])) if names else num(fn)
        arrays[name] = arr.tolist()
    consts = {n: num(s_) for n, s_ in leaf.syms.items()}
    return {"dims": use, "smt_dims": dim_vals, "arrays": arrays, "consts": consts}


def _leaf_fn(f: Any, rank: int) -> Any:
    return (lambda i: f(*i)) if rank else (lambda i: f)


def _eq(a: Any, b: Any) -> Any:
    import z3

    if isinstance(a, int) and isinstance(b, int):
        return z3.BoolVal(a == b)
    return a == b


# -- the parent side: replay in numpy ------------------------------------------------------


def instantiate(
    rule: Rule,
    side: Term,
    dims: dict[str, int],
    consts: dict[str, float],
    batch: int,
    dtype: str = "f64",
) -> Any:
    """A module computing one side of the rule on concrete shapes (leaves are arguments)."""
    from llmir_core.builder import Builder, new_module
    from llmir_core.ir.attrs import DenseAttr
    from llmir_core.ir.core import Function
    from llmir_core.ir.types import DTYPE_NAMES, TensorType

    dt = DTYPE_NAMES[rule.dtypes.get("*", dtype)]
    mod = new_module("rule", ("core", "llm"))
    fn = Function("main", [])
    mod.functions.append(fn)
    b = Builder(fn)
    vals: dict[str, Any] = {}
    leaf_defs = leaves(rule.lhs)
    leaves(rule.rhs, leaf_defs)
    for name, leaf in leaf_defs.items():
        if isinstance(leaf, V):
            shape = tuple(dims[n] for n in dim_names(rule.sig.get(name, ""), batch))
            ldt = DTYPE_NAMES[rule.dtypes[name]] if name in rule.dtypes and dtype == "f64" else dt
            vals[name] = b.arg(name, TensorType(shape, ldt))
    attrs = _attrs_for(rule, batch)
    cache: dict[int, Any] = {}

    def resolve(v: Any) -> Any:
        if isinstance(v, A):
            return resolve(attrs[v.name]) if v.name in attrs else float(consts[v.name])
        if isinstance(v, tuple):
            return tuple(resolve(x) for x in v)
        if isinstance(v, str) and v in dims:
            return dims[v]
        if isinstance(v, str) and v in DTYPE_NAMES and rule.proof_attrs is not None:
            return DTYPE_NAMES[v]
        return v

    def build(term: Term) -> Any:
        if isinstance(term, V):
            return vals[term.name]
        if isinstance(term, (C, K)):
            x = consts[term.name] if isinstance(term, C) else term.value
            return b.op("core.constant", value=DenseAttr(np.array(x, dtype=dt.to_numpy())))
        assert isinstance(term, T)
        if id(term) not in cache:
            args = [build(a) for a in term.args]
            cache[id(term)] = b.create(
                term.op, args, {k: resolve(v) for k, v in term.attrs.items()}
            )
        return cache[id(term)].results[term.result]

    b.ret(build(side))
    return mod


def replay(
    rule: Rule,
    batch: int,
    dims: dict[str, int],
    consts: dict[str, float],
    arrays: dict[str, Any] | None,
    seeds: int = 4,
    dtype: str = "f64",
) -> dict[str, Any] | None:
    """Run both sides; return a counterexample dict when they differ, else None."""
    from llmir_core.dialects.opdef import OpVerifyError
    from llmir_core.interp import run
    from llmir_core.ir.types import DTYPE_NAMES

    try:
        lm = instantiate(rule, rule.lhs, dims, consts, batch, dtype)
    except Exception as exc:  # noqa: BLE001 - the pattern itself cannot be built here
        raise ReplayError(f"the pattern does not build at dims {dims}: {exc}") from exc
    try:
        rm = instantiate(rule, rule.rhs, dims, consts, batch, dtype)
    except OpVerifyError as exc:  # the replacement is ill-typed where the pattern is not
        return {
            "source": "shapes",
            "dims": dims,
            "consts": consts,
            "inputs": {},
            "error": f"the replacement does not type-check: {exc}",
            "max_abs_diff": float("inf"),
        }
    args = lm.main.args
    tol = {"f64": 1e-9, "f32": 2e-5, "f16": 2e-2, "bf16": 5e-2}.get(dtype, 1e-9)
    trials: list[tuple[str, dict[str, Any]]] = []
    if arrays is not None:
        trials.append(("smt model", {a.name: np.asarray(arrays[a.name]) for a in args}))
    rng = np.random.default_rng(0)
    for s in range(seeds):
        trials.append(
            (
                f"random seed {s}",
                {a.name: rng.normal(size=a.type.static_shape()) * (1 + 9 * (s % 2)) for a in args},
            )
        )
    for label, raw in trials:
        inputs = {
            k: np.asarray(v).astype(DTYPE_NAMES[str(a.type.dtype)].to_numpy())
            for a in args
            for k, v in raw.items()
            if k == a.name
        }
        try:
            lo = run(lm, inputs)[0]
            ro = run(rm, {k: v for k, v in inputs.items() if k in {a.name for a in rm.main.args}})[
                0
            ]
        except Exception as exc:  # noqa: BLE001 - an op that cannot run here
            raise ReplayError(f"cannot run the rule in numpy: {type(exc).__name__}: {exc}") from exc
        lo64, ro64 = np.asarray(lo, np.float64), np.asarray(ro, np.float64)
        if lo64.shape != ro64.shape or not np.allclose(
            lo64, ro64, rtol=tol, atol=tol, equal_nan=True
        ):
            diff = (
                float(np.nanmax(np.abs(lo64 - ro64))) if lo64.shape == ro64.shape else float("inf")
            )
            return {
                "source": label,
                "dims": dims,
                "consts": consts,
                "inputs": {k: np.asarray(v).round(6).tolist() for k, v in inputs.items()},
                "lhs": lo64.round(6).tolist(),
                "rhs": ro64.round(6).tolist(),
                "max_abs_diff": diff,
            }
    return None


def prove(rule: Rule, limit_s: float = 10.0, dtype_checks: bool = True) -> RuleVerdict:
    t0 = time.perf_counter()
    if rule.bound is not None:
        return _prove_bound(rule, limit_s, t0)
    if rule.obligation is not None:
        return _prove_obligation(rule, limit_s, t0)
    per: list[dict[str, Any]] = []
    final, detail, cex = "proved", "", None
    for batch in rule.batch_ranks:
        res = run_job(_job, rule, batch, limit_s, limit_s=limit_s)
        v = res["verdict"]
        entry = {"batch_rank": batch, "verdict": v, "seconds": round(res.get("seconds", 0.0), 4)}
        per.append(entry)
        if v == "unsat":
            continue
        if v == "sat":
            model = res.get("model")
            dims = model["dims"] if model else {n: 2 for n in _all_dims(rule, batch)}
            consts = model["consts"] if model else {}
            try:
                found = replay(rule, batch, dims, consts, model["arrays"] if model else None)
            except ReplayError as exc:
                final, detail = (
                    "unknown",
                    f"z3 found a difference that could not be replayed: {exc}",
                )
                break
            if found is not None:
                final, cex = "refuted", {"batch_rank": batch, **found}
                detail = res.get("reason", f"sides differ (max |diff| {found['max_abs_diff']:.3g})")
                break
            final, detail = (
                "spurious",
                "z3 found a model of the uninterpreted functions, but numpy shows no difference",
            )
            continue
        final, detail = v, res.get("reason", "")
        break
    method = "smt"
    if final in ("unknown", "inconclusive", "spurious"):
        found = _differential(rule)
        if found is not None:
            final, cex, method = (
                "refuted",
                {"batch_rank": rule.batch_ranks[-1], **found},
                "differential (smt: " + final + ")",
            )
            detail = f"smt: {detail}; numpy shows a difference of {found['max_abs_diff']:.3g}"
    out = RuleVerdict(
        rule.name, final, time.perf_counter() - t0, rule.tag, method, detail, cex, per
    )
    if dtype_checks and final == "proved" and rule.tag == "reassociating":
        out.dtype_checks = _dtype_checks(rule)
    return out


def _prove_obligation(rule: Rule, limit_s: float, t0: float) -> RuleVerdict:
    """A rule with its own SMT obligation (which must be about its lhs and rhs)."""
    terms = getattr(rule.obligation, "terms", None)
    if terms is None or terms[0] != rule.lhs or terms[1] != rule.rhs:
        return RuleVerdict(
            rule.name,
            "unproved",
            time.perf_counter() - t0,
            rule.tag,
            "smt (obligation)",
            "the obligation is not about the rule's own lhs and rhs",
        )
    res = run_job(_obligation_job, rule, limit_s, limit_s=limit_s)
    verdict = {"unsat": "proved"}.get(res["verdict"], res["verdict"])
    detail = res.get("reason", "")
    cex = res.get("model")
    if verdict == "sat":
        verdict = "refuted"
    return RuleVerdict(rule.name, verdict, time.perf_counter() - t0, rule.tag, "smt", detail, cex)


def _differential(rule: Rule) -> dict[str, Any] | None:
    """When SMT could not decide: a numpy difference between the sides at fixed inputs (dims 3,
    constants 0.5, the largest batch rank), which refutes (never proves) the rule; or None."""
    batch = rule.batch_ranks[-1]
    try:
        return replay(
            rule,
            batch,
            {n: 3 for n in _all_dims(rule, batch)},
            {n: 0.5 for n, lf in leaves(rule.lhs).items() if isinstance(lf, C)},
            None,
        )
    except ReplayError:
        return None


def _prove_bound(rule: Rule, limit_s: float, t0: float) -> RuleVerdict:
    """An approximate rule: |rhs - lhs| <= its bound, proved about its own terms
    (`llmir_core.smt.prove_approx`); `refuted` when z3 shows the bound failing in the rounding model,
    `unproved` when it could not decide (a reduction without a per-term bound)."""
    from .prove_approx import approx_job

    assert rule.bound is not None
    if not math.isfinite(rule.bound.rel):
        return RuleVerdict(
            rule.name,
            "unproved",
            time.perf_counter() - t0,
            rule.tag,
            "none",
            rule.bound.describe(),
            bound=rule.bound.describe(),
        )
    cases = max(1, len(rule.proof_cases)) * len(rule.batch_ranks)
    res = run_job(approx_job, rule, limit_s, limit_s=limit_s * cases + 2)
    v = res["verdict"]
    verdict = {"unsat": "proved", "sat": "refuted", "unlifted": "unproved"}.get(v, v)
    detail = res.get("reason", "")
    if verdict == "proved" and res.get("lifts"):
        detail = "; ".join(res["lifts"])
    cex = res.get("model")
    if cex is not None and res.get("case") is not None:
        cex = {**cex, "case": res["case"], "batch_rank": res.get("batch_rank")}
    assert rule.bound is not None
    return RuleVerdict(
        rule.name,
        verdict,
        time.perf_counter() - t0,
        rule.tag,
        "smt (error bound, rounding model)",
        detail,
        cex,
        bound=rule.bound.describe(),
    )


def _all_dims(rule: Rule, batch: int) -> list[str]:
    out: list[str] = []
    for sig in rule.sig.values():
        out += [n for n in dim_names(sig, batch) if n not in out]
    return out


def _dtype_checks(rule: Rule) -> dict[str, str]:
    out = {}
    batch = rule.batch_ranks[-1]
    dims = {n: 3 for n in _all_dims(rule, batch)}
    consts = {n: 1e-5 for n, leaf in leaves(rule.lhs).items() if isinstance(leaf, C)}
    for dt in ("f32", "f16"):
        try:
            found = replay(rule, batch, dims, consts, None, seeds=3, dtype=dt)
        except Exception as exc:  # noqa: BLE001 - an op without that dtype
            out[dt] = f"skipped ({str(exc)[:80]})"
            continue
        out[dt] = "ok" if found is None else f"differs by {found['max_abs_diff']:.3g}"
    return out


def _obligation_job(rule: Rule, limit_s: float) -> dict[str, Any]:
    import z3

    assert rule.obligation is not None
    hyps, goal, show = rule.obligation()
    s = z3.Solver()
    s.set("timeout", int(limit_s * 1000))
    s.add(hyps)
    if s.check() == z3.unsat:
        return {"verdict": "vacuous", "reason": "the hypotheses cannot hold"}
    s.add(z3.Not(goal))
    r = s.check()
    if r == z3.unsat:
        return {"verdict": "unsat"}
    if r == z3.unknown:
        return {"verdict": "unknown", "reason": s.reason_unknown()}
    m = s.model()
    return {
        "verdict": "sat",
        "reason": "the error bound fails",
        "model": {str(k): str(m.eval(k, model_completion=True)) for k in show},
    }
