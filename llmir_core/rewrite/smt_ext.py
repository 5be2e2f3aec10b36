"""The encoder of `lhs == rhs` obligations for the fusion and lifting rules (`ExtEncoder`, the
base encoder with two normal-form choices, and `encode_equality`). The ops' own encodings are on
their declarations (`OpDef.smt`); this module only fixes how both sides of a rule are written.

Like `llmir_core.smt.semantics`, which it extends, this module imports z3 at the top and is
imported only inside the solver child (the obligations in `llmir_core.rewrite.obligations` import
it lazily).

Two encoding choices keep both sides of a rule in one normal form:
- `a / b` is encoded as `a * (1 / b)` (equal over the reals for b != 0), so a scale written as a
  division and one written as a multiplication by the reciprocal meet;
- sums of squares are recognized before simplification expands them, so their lemma applies.
(An additive mask of `-inf` and `0` entries is a `semantics.MaskTensor`: core.add's encoding
gives `If(masked, NEG_INF, x)`, IEEE's `x + -inf = -inf` for finite x.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import z3

from llmir_core.smt.semantics import EncodeError, Encoder, STensor, _is_square

from .terms import A, C, K, T, Term, V, leaves

Idx = tuple[Any, ...]


class ExtEncoder(Encoder):
    def sum(self, n: Any, body: Callable[[Any], Any]) -> Any:
        """As the base encoder, but a square is recognized before simplification expands it
        ((x - m) * (x - m) becomes a polynomial), so the sum-of-squares lemma still applies."""
        raw = body(z3.Int(f"k{self._depth + 1}"))
        s = super().sum(n, body)
        if _is_square(raw):
            self.lemma(("sumsq", s.get_id()), s >= 0)
        return s

    def op(
        self, name: str, args: Sequence[STensor], attrs: dict[str, Any], leaf_dtype: str = "f32"
    ) -> list[STensor]:
        if name == "core.div":
            return [self.elementwise(lambda a, b: a * (1 / b), *args)]
        return super().op(name, args, attrs, leaf_dtype)


def _captures_bound(e: Any) -> bool:
    """Whether a lemma mentions a bound index (`k1`, `k2`, ...) outside its binder: a lemma made
    inside a reduction body, which says nothing about the reduction."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if x.get_id() in seen:
            continue
        seen.add(x.get_id())
        if z3.is_quantifier(x):
            continue
        if (
            z3.is_const(x)
            and x.decl().kind() == z3.Z3_OP_UNINTERPRETED
            and x.decl().name()[:1] == "k"
            and x.decl().name()[1:].isdigit()
        ):
            return True
        stack.extend(x.children())
    return False


# -- the obligation: lhs == rhs at a symbolic index, for every listed batch rank -----------------


def _dims_of(sig: str, batch: int, dims: dict[str, Any], suffix: str) -> tuple[Any, ...]:
    out: list[Any] = []
    for tok in sig.split():
        if tok == "...":
            for j in range(batch):
                out.append(dims.setdefault(f"b{j}", z3.Int(f"b{j}{suffix}")))
            continue
        prod: Any = None
        for part in tok.split("*"):
            f = int(part) if part.isdigit() else dims.setdefault(part, z3.Int(f"{part}{suffix}"))
            prod = f if prod is None else prod * f
        out.append(prod)
    return tuple(out)


def _leaf_env(
    lhs: Term,
    rhs: Term,
    sig: dict[str, str],
    batch: int,
    dims: dict[str, Any],
    sfx: str,
    int_leaves: Sequence[str],
) -> dict[str, Any]:
    """Each leaf of the two sides: a constant as a z3 real, a tensor as a symbolic tensor over
    an uninterpreted function (integer-valued for `int_leaves`); dims are added to `dims`."""
    env: dict[str, Any] = {}
    all_leaves = leaves(lhs)
    leaves(rhs, all_leaves)
    for name, leaf in all_leaves.items():
        if isinstance(leaf, C):
            env[name] = z3.Real(name + sfx)
            continue
        shape = _dims_of(sig.get(name, ""), batch, dims, sfx)
        sort = z3.IntSort() if name in int_leaves else z3.RealSort()
        fn = (
            z3.Function(name + sfx, *([z3.IntSort()] * len(shape)), sort)
            if shape
            else z3.Const(name + sfx, sort)
        )
        env[name] = STensor(
            shape, (lambda g, n: (lambda i: g(*i)) if n else (lambda i: g))(fn, len(shape))
        )
    return env


def _term_encoder(
    enc: ExtEncoder, env: dict[str, Any], attrs: dict[str, Any], syms: dict[str, Any], sfx: str
) -> Callable[[Term], STensor]:
    """term -> its symbolic tensor, each op encoded once; an attribute names a proof attribute
    or a symbol (a fresh real, added to `syms`, when it is new)."""
    cache: dict[int, list[STensor]] = {}

    def resolve(v: Any) -> Any:
        if isinstance(v, A):
            if v.name in attrs:
                return attrs[v.name]
            if v.name not in syms:
                syms[v.name] = z3.Real(v.name + sfx)
            return syms[v.name]
        if isinstance(v, (tuple, list)):
            return tuple(resolve(x) for x in v)
        return v

    def encode(term: Term) -> STensor:
        if isinstance(term, V):
            return env[term.name]
        if isinstance(term, C):
            c = env[term.name]
            return STensor((), lambda i: c)
        if isinstance(term, K):
            return STensor((), (lambda c: lambda i: c)(z3.RealVal(term.value)))
        assert isinstance(term, T)
        if id(term) not in cache:
            at = {k: resolve(v) for k, v in term.attrs.items()}
            at.update(attrs.get(f"__{term.op}__", {}))
            cache[id(term)] = enc.op(term.op, [encode(a) for a in term.args], at)
        return cache[id(term)][term.result]

    return encode


def encode_equality(
    lhs: Term,
    rhs: Term,
    sig: dict[str, str],
    batch_ranks: Sequence[int],
    assume: Callable[[dict[str, Any]], list[Any]] | None,
    proof_attrs: Callable[[int, dict[str, Any]], dict[str, Any]] | None,
    int_leaves: Sequence[str],
    hyps_at: Callable[[dict[str, Any], Idx], list[Any]] | None,
) -> tuple[list[Any], Any, list[Any]]:
    """(hypotheses, goal, symbols to show) stating that lhs and rhs have equal shapes and are
    equal at a symbolic index, for symbolic dims, for each batch rank."""
    hyps: list[Any] = []
    goals: list[Any] = []
    show: list[Any] = []
    for batch in batch_ranks:
        sfx = f"@{batch}"
        enc = ExtEncoder()
        dims: dict[str, Any] = {}
        env = _leaf_env(lhs, rhs, sig, batch, dims, sfx, int_leaves)
        syms = {
            **{k: v for k, v in env.items() if not isinstance(v, STensor)},
            **dims,
            "__leaves__": env,
        }
        attrs = dict(proof_attrs(batch, syms)) if proof_attrs else {}
        syms.update({k: v for k, v in attrs.items() if isinstance(v, z3.ExprRef)})
        encode = _term_encoder(enc, env, attrs, syms, sfx)
        lt, rt = encode(lhs), encode(rhs)
        if lt.rank != rt.rank:
            raise EncodeError(f"ranks differ: {lt.rank} vs {rt.rank}")
        idx = tuple(z3.Int(f"i{j}{sfx}") for j in range(lt.rank))
        lv, rv = lt.f(idx), rt.f(idx)
        hyps += [d >= 1 for d in dims.values()]
        hyps += [z3.And(0 <= i, i < d) for i, d in zip(idx, lt.shape)]
        if assume is not None:
            hyps += assume(syms)
        if hyps_at is not None:
            hyps += hyps_at(syms, idx)
        if not lv.eq(rv):  # syntactically equal sides need no lemma (and z3 then answers at once)
            hyps += [f for f in enc.lemmas() if not _captures_bound(f)]
        same_shape = [
            z3.simplify(a == b)
            if not (isinstance(a, int) and isinstance(b, int))
            else z3.BoolVal(a == b)
            for a, b in zip(lt.shape, rt.shape)
        ]
        goals.append(z3.And(*same_shape, lv == rv))
        show += list(dims.values()) + list(idx)
    return hyps, z3.And(*goals), show
