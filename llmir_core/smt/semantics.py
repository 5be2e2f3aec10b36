"""Element-level SMT semantics of ops over the reals (the only place besides `solver.py` and
`prove.py` that touches z3; all three are imported only inside the solver subprocess).

A symbolic tensor (`STensor`) is a shape (z3 Ints or Python ints) and a function from an index
tuple to a z3 Real (or Bool). Reductions are `Sum(n, λk. body)` with `Sum` an uninterpreted
function of a length and an array (z3 lambda); `exp`, `sqrt`, `rsqrt`, `erf`, `tanh`, `sigmoid`,
`log`, ... are uninterpreted functions. The encoder records the ground lemma instances it needs
(sums of squares are >= 0, `rsqrt(t) * sqrt(t) = 1` and both positive for `t > 0`, `exp(t) > 0`,
sum linearity for constant factors) and `lemmas()` returns them; quantified axioms are avoided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

Idx = tuple[Any, ...]


@dataclass
class STensor:
    shape: tuple[Any, ...]
    f: Callable[[Idx], Any]

    @property
    def rank(self) -> int:
        return len(self.shape)


def has_encoding(name: str) -> bool:
    """Whether the encoder library (the fallback for ops without a declared `smt`) covers op
    `name`: the elementwise tables or an `op_<dialect>_<name>` method (here or in
    `llmir_core.rewrite.smt_ext`, which extends the Encoder)."""
    from llmir_core.rewrite.smt_ext import ExtEncoder

    return name in BINARY or name in UNARY or hasattr(ExtEncoder, f"op_{name.replace('.', '_')}")


class EncodeError(Exception):
    """The op has no element-level semantics here (the prover reports `unknown`)."""


def _is_one(d: Any) -> bool:
    return isinstance(d, int) and d == 1


def _dim_eq(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return z3.simplify(a == b) if not (isinstance(a, int) and isinstance(b, int)) else a == b


class Encoder:
    def __init__(self) -> None:
        self.R = z3.RealSort()
        self.I = z3.IntSort()
        self.sum_fn = z3.Function("Sum", self.I, z3.ArraySort(self.I, self.R), self.R)
        self.max_fn = z3.Function("MaxR", self.I, z3.ArraySort(self.I, self.R), self.R)
        self.min_fn = z3.Function("MinR", self.I, z3.ArraySort(self.I, self.R), self.R)
        self.funcs: dict[str, Any] = {}
        self._lemmas: list[Any] = []
        self._seen_lemma: set[int] = set()
        self._k = 0
        self._depth = 0

    # -- helpers -------------------------------------------------------------------------
    def uf(self, name: str, arity: int = 1) -> Any:
        key = f"{name}/{arity}"
        if key not in self.funcs:
            self.funcs[key] = z3.Function(name, *([self.R] * arity), self.R)
        return self.funcs[key]

    def lemma(self, key: Any, fact: Any) -> None:
        h = hash(key)
        if h not in self._seen_lemma:
            self._seen_lemma.add(h)
            self._lemmas.append(fact)

    def lemmas(self) -> list[Any]:
        return list(self._lemmas)

    def fresh(self, base: str = "k") -> Any:
        self._k += 1
        return z3.Int(f"{base}!{self._k}")

    def real_dim(self, d: Any) -> Any:
        return z3.RealVal(d) if isinstance(d, int) else z3.ToReal(d)

    def bound(self, body: Callable[[Any], Any]) -> tuple[Any, Any]:
        """A bound index named by nesting depth, so equal sums are equal ASTs (hash-consed)."""
        self._depth += 1
        try:
            k = z3.Int(f"k{self._depth}")
            return k, z3.simplify(body(k), som=True)
        finally:
            self._depth -= 1

    def sum(self, n: Any, body: Callable[[Any], Any]) -> Any:
        k, e = self.bound(body)
        s = self.sum_fn(n if not isinstance(n, int) else z3.IntVal(n), z3.Lambda([k], e))
        if _is_square(e):
            self.lemma(("sumsq", s.get_id()), s >= 0)
        return s

    def sqrt(self, x: Any) -> Any:
        r = self.uf("sqrt")(x)
        self._root_lemmas(x)
        return r

    def rsqrt(self, x: Any) -> Any:
        r = self.uf("rsqrt")(x)
        self._root_lemmas(x)
        return r

    def _root_lemmas(self, x: Any) -> None:
        s, r = self.uf("sqrt")(x), self.uf("rsqrt")(x)
        self.lemma(
            ("root", x.get_id()), z3.Implies(x > 0, z3.And(s > 0, r > 0, s * r == 1, s * s == x))
        )

    def exp(self, x: Any) -> Any:
        e = self.uf("exp")(x)
        self.lemma(("exp", e.get_id()), e > 0)
        return e

    # -- broadcasting --------------------------------------------------------------------
    def broadcast(self, *ts: STensor) -> tuple[tuple[Any, ...], list[Callable[[Idx], Idx]]]:
        rank = max(t.rank for t in ts)
        out: list[Any] = []
        for i in range(rank):
            d: Any = 1
            for t in ts:
                j = i - (rank - t.rank)
                if j >= 0 and not _is_one(t.shape[j]):
                    d = t.shape[j] if _is_one(d) else d
            out.append(d)
        maps: list[Callable[[Idx], Idx]] = []
        for t in ts:
            off = rank - t.rank

            def mp(idx: Idx, t: STensor = t, off: int = off) -> Idx:
                return tuple(0 if _is_one(t.shape[j]) else idx[j + off] for j in range(t.rank))

            maps.append(mp)
        return tuple(out), maps

    def elementwise(self, fn: Callable[..., Any], *ts: STensor) -> STensor:
        shape, maps = self.broadcast(*ts)
        return STensor(shape, lambda idx: fn(*(t.f(m(idx)) for t, m in zip(ts, maps))))

    # -- ops -----------------------------------------------------------------------------
    def op(
        self, name: str, args: Sequence[STensor], attrs: dict[str, Any], leaf_dtype: str = "f32"
    ) -> list[STensor]:
        from llmir_core.dialects.registry import get_op

        od = get_op(name)
        if od is not None and od.smt is not None:  # the op declares its own encoding
            out = od.smt(self, args, od.with_defaults(attrs))
            return out if isinstance(out, list) else [out]
        short = name.split(".", 1)[1]
        if name in BINARY:
            return [self.elementwise(BINARY[name](self), *args)]
        if name in UNARY:
            return [self.elementwise(UNARY[name](self), args[0])]
        handler = getattr(self, f"op_{name.replace('.', '_')}", None)
        if handler is None:
            raise EncodeError(f"no element-level semantics for {name}")
        out = handler(args, attrs)
        del short
        return out if isinstance(out, list) else [out]

    def op_core_cast(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x = args[0]
        if str(attrs.get("to")) == str(attrs.get("__from__", attrs.get("to"))):
            return x
        g = self.uf(f"cast_{attrs['to']}")
        return STensor(x.shape, lambda i: g(x.f(i)))

    def op_core_identity(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        return args[0]

    def op_core_gelu(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        g = self.uf(f"gelu_{attrs.get('approximate', 'none')}")
        x = args[0]
        return STensor(x.shape, lambda i: g(x.f(i)))

    def op_core_pow(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        a, b = args
        if b.rank == 0:
            e = z3.simplify(b.f(()))
            if z3.is_rational_value(e) and e.as_fraction() == 2:
                return STensor(a.shape, lambda i: a.f(i) * a.f(i))
        return self.elementwise(self.uf("pow", 2), a, b)

    def op_core_transpose(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x = args[0]
        perm = [p % x.rank for p in attrs["perm"]]
        shape = tuple(x.shape[p] for p in perm)

        def f(idx: Idx) -> Any:
            src: list[Any] = [None] * x.rank
            for a, p in enumerate(perm):
                src[p] = idx[a]
            return x.f(tuple(src))

        return STensor(shape, f)

    def op_core_matmul(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        a, b = args
        if a.rank < 2 or b.rank < 2:
            raise EncodeError("matmul of vectors is not encoded")
        if attrs.get("transpose_a"):
            a = self.op_core_transpose(
                [a], {"perm": tuple(range(a.rank - 2)) + (a.rank - 1, a.rank - 2)}
            )
        if attrs.get("transpose_b"):
            b = self.op_core_transpose(
                [b], {"perm": tuple(range(b.rank - 2)) + (b.rank - 1, b.rank - 2)}
            )
        ab = STensor(a.shape[:-2], lambda i: 0)
        bb = STensor(b.shape[:-2], lambda i: 0)
        batch, (ma, mb) = self.broadcast(ab, bb)
        n_k = a.shape[-1]
        shape = tuple(batch) + (a.shape[-2], b.shape[-1])
        nb = len(batch)

        def f(idx: Idx) -> Any:
            bi = idx[:nb]
            i, j = idx[nb], idx[nb + 1]
            return self.sum(n_k, lambda k: a.f(ma(bi) + (i, k)) * b.f(mb(bi) + (k, j)))

        return STensor(shape, f)

    def _reduce(self, x: STensor, attrs: dict[str, Any], kind: str) -> STensor:
        axes = sorted({a % x.rank for a in attrs.get("axes", ())} or set(range(x.rank)))
        keep = attrs.get("keepdims", True)
        shape = tuple(
            (1 if i in axes else d) for i, d in enumerate(x.shape) if keep or i not in axes
        )

        def f(idx: Idx) -> Any:
            full: list[Any] = []
            it = iter(idx)
            for i in range(x.rank):
                if i in axes:
                    if keep:
                        next(it)
                    full.append(None)
                else:
                    full.append(next(it))
            return self._nested(x, full, axes, kind)

        return STensor(shape, f)

    def _nested(self, x: STensor, full: list[Any], axes: list[int], kind: str) -> Any:
        if not axes:
            return x.f(tuple(full))
        ax, rest = axes[0], axes[1:]

        def body(k: Any) -> Any:
            g = list(full)
            g[ax] = k
            return self._nested(x, g, rest, kind)

        n = x.shape[ax]
        if kind in ("sum", "mean"):
            s = self.sum(n, body)
            return s / self.real_dim(n) if kind == "mean" else s
        fn = self.max_fn if kind == "max" else self.min_fn
        k, e = self.bound(body)
        return fn(n if not isinstance(n, int) else z3.IntVal(n), z3.Lambda([k], e))

    def op_core_reduce_sum(self, a: Sequence[STensor], at: dict[str, Any]) -> STensor:
        return self._reduce(a[0], at, "sum")

    def op_core_reduce_mean(self, a: Sequence[STensor], at: dict[str, Any]) -> STensor:
        return self._reduce(a[0], at, "mean")

    def op_core_reduce_max(self, a: Sequence[STensor], at: dict[str, Any]) -> STensor:
        return self._reduce(a[0], at, "max")

    def op_core_reduce_min(self, a: Sequence[STensor], at: dict[str, Any]) -> STensor:
        return self._reduce(a[0], at, "min")

    def op_core_softmax(self, a: Sequence[STensor], at: dict[str, Any]) -> STensor:
        x = a[0]
        ax = at.get("axis", -1) % x.rank
        mx = self._reduce(x, {"axes": (ax,), "keepdims": True}, "max")
        e = STensor(x.shape, lambda i: self.exp(x.f(i) - mx.f(_zero_at(i, ax))))
        s = self._reduce(e, {"axes": (ax,), "keepdims": True}, "sum")
        return STensor(x.shape, lambda i: e.f(i) / s.f(_zero_at(i, ax)))

    def op_core_concat(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        ax = attrs["axis"] % args[0].rank
        total: Any = 0
        offs = []
        for t in args:
            offs.append(total)
            total = total + t.shape[ax]
        shape = tuple(total if i == ax else d for i, d in enumerate(args[0].shape))

        def f(idx: Idx) -> Any:
            out = args[-1].f(_shift(idx, ax, -offs[-1]))
            for t, o in zip(reversed(args[:-1]), reversed(offs[:-1])):
                out = z3.If(idx[ax] < o + t.shape[ax], t.f(_shift(idx, ax, -o)), out)
            return out

        return STensor(shape, f)

    def op_core_split(self, args: Sequence[STensor], attrs: dict[str, Any]) -> list[STensor]:
        x = args[0]
        ax = attrs["axis"] % x.rank
        outs, off = [], 0
        for s in attrs["sizes"]:
            shape = tuple(s if i == ax else d for i, d in enumerate(x.shape))
            outs.append(STensor(shape, (lambda o: lambda idx: x.f(_shift(idx, ax, o)))(off)))
            off = off + s
        return outs

    # -- llm ops: their definitions ------------------------------------------------------
    def op_llm_rms_norm(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x, w = args[0], args[1]
        eps = attrs.get("eps", 1e-6)
        eps = eps if not isinstance(eps, float) else z3.RealVal(eps)
        off = attrs.get("offset", 0.0)
        ms = self._reduce(
            STensor(x.shape, lambda i: x.f(i) * x.f(i)), {"axes": (-1,), "keepdims": True}, "mean"
        )
        last = x.rank - 1

        def f(i: Idx) -> Any:
            t = ms.f(_zero_at(i, last)) + eps
            return x.f(i) * self.rsqrt(t) * (w.f((i[-1],)) + off)

        return STensor(x.shape, f)

    def op_llm_silu_mul(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        return self.elementwise(lambda g, u: UNARY["core.silu"](self)(g) * u, args[0], args[1])

    def op_llm_gated_mlp(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x, wg, wu, wd = args
        act = attrs.get("activation", "silu")
        g = self.op_core_matmul([x, wg], {"transpose_b": True})
        u = self.op_core_matmul([x, wu], {"transpose_b": True})
        if act == "silu":
            h = self.op_llm_silu_mul([g, u], {})
        else:
            ga = self.op_core_gelu([g], {"approximate": "tanh" if act == "gelu_tanh" else "none"})
            h = self.elementwise(lambda p, q: p * q, ga, u)
        return self.op_core_matmul([h, wd], {"transpose_b": True})


def _zero_at(idx: Idx, ax: int) -> Idx:
    return tuple(0 if i == ax else v for i, v in enumerate(idx))


def _shift(idx: Idx, ax: int, by: Any) -> Idx:
    return tuple(v + by if i == ax else v for i, v in enumerate(idx))


def _is_square(e: Any) -> bool:
    if z3.is_mul(e) and e.num_args() == 2 and e.arg(0).eq(e.arg(1)):
        return True
    if (
        z3.is_app_of(e, z3.Z3_OP_POWER)
        and z3.is_rational_value(e.arg(1))
        and e.arg(1).as_fraction() == 2
    ):
        return True
    return False


def _sigmoid(enc: Encoder) -> Callable[[Any], Any]:
    return lambda x: enc.uf("sigmoid")(x)


def _uninterpreted(name: str) -> Callable[[Encoder], Callable[[Any], Any]]:
    return lambda e: lambda x: e.uf(name)(x)


BINARY: dict[str, Callable[[Encoder], Callable[[Any, Any], Any]]] = {
    "core.add": lambda e: lambda a, b: a + b,
    "core.sub": lambda e: lambda a, b: a - b,
    "core.mul": lambda e: lambda a, b: a * b,
    "core.div": lambda e: lambda a, b: a / b,
    "core.max": lambda e: lambda a, b: z3.If(a >= b, a, b),
    "core.min": lambda e: lambda a, b: z3.If(a <= b, a, b),
    "core.equal": lambda e: lambda a, b: a == b,
    "core.less": lambda e: lambda a, b: a < b,
    "core.greater": lambda e: lambda a, b: a > b,
}
UNARY: dict[str, Callable[[Encoder], Callable[[Any], Any]]] = {
    "core.neg": lambda e: lambda x: -x,
    "core.abs": lambda e: lambda x: z3.If(x >= 0, x, -x),
    "core.relu": lambda e: lambda x: z3.If(x > 0, x, 0),
    "core.exp": lambda e: e.exp,
    "core.sqrt": lambda e: e.sqrt,
    "core.rsqrt": lambda e: e.rsqrt,
    "core.reciprocal": lambda e: lambda x: 1 / x,
    "core.sigmoid": _sigmoid,
    "core.silu": lambda e: lambda x: x * _sigmoid(e)(x),
    **{
        f"core.{n}": _uninterpreted(n)
        for n in ("log", "tanh", "erf", "sin", "cos", "floor", "ceil", "round", "sign")
    },
}
