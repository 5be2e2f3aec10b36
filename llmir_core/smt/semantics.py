"""The element-level SMT encoder over the reals: symbolic tensors and the shared helpers op
encodings are written with. Each op's own encoding lives on its declaration (`OpDef.smt`, in
`llmir_core/dialects/*_smt.py`); `Encoder.op` dispatches to it. This module, those and `prove.py`
import z3 and are imported only inside the solver subprocess (or by tests).

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


@dataclass
class MaskTensor(STensor):
    """An additive mask whose elements are -inf where `cond(idx)` holds and 0 elsewhere."""

    cond: Callable[[Idx], Any] = lambda i: z3.BoolVal(False)


@dataclass
class CodesTensor(STensor):
    """Block-quantized data encoded by its integer codes (element [.., n, k]: the code of logical
    element k of row n); `qtype` is its `QuantType` (which layout the codes follow)."""

    qtype: Any = None


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
        self.neg_inf = z3.Real("NEG_INF")  # stands for -inf: x + -inf = -inf for finite x

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

    # -- dispatch: every op's encoding is on its declaration ---------------------------------
    def op(
        self, name: str, args: Sequence[STensor], attrs: dict[str, Any], leaf_dtype: str = "f32"
    ) -> list[STensor]:
        from llmir_core.dialects import registry

        od = registry.get_op(name)  # loads the registry, so BUILTIN_DIALECTS is known
        # an extension op (a plugin's dialect) with no encoding means its decomposition; the
        # built-in ops without one keep their stated reason (`no_smt`)
        if od and od.smt is None and od.decompose and od.dialect not in registry.BUILTIN_DIALECTS:
            return self.decomposed(od, args, attrs, leaf_dtype)
        if od is None or od.smt is None:
            why = f" ({od.no_smt})" if od is not None and od.no_smt else ""
            raise EncodeError(f"no element-level semantics for {name}{why}")
        out = od.smt(self, args, od.with_defaults(attrs))
        return out if isinstance(out, list) else [out]

    def decomposed(
        self, od: Any, args: Sequence[STensor], attrs: dict[str, Any], leaf_dtype: str
    ) -> list[STensor]:
        """An op with no encoding of its own means its decomposition (an extension op's
        fallback): each op of it encoded in turn, over the operands' tensors. Built with static
        dims where the operands have them (any other dim is dynamic) in `leaf_dtype`."""
        from llmir_core.builder import Builder
        from llmir_core.ir.core import Function, Value
        from llmir_core.ir.dims import DYN
        from llmir_core.ir.types import DType, TensorType

        dims = [tuple(d if isinstance(d, int) else DYN for d in a.shape) for a in args]
        params = [Value(f"a{i}", TensorType(s, DType(leaf_dtype))) for i, s in enumerate(dims)]
        fn = Function(f"{od.name}.decomposed", params)
        try:
            outs = od.decompose(Builder(fn), params, od.with_defaults(attrs))
        except Exception as exc:  # noqa: BLE001 - a decomposition that cannot be built here
            raise EncodeError(f"{od.name}: its decomposition cannot be built here: {exc}") from None
        env = {id(p): a for p, a in zip(params, args)}
        for op in fn.ops:
            res = self.op(op.name, [env[id(v)] for v in op.operands], op.attrs, leaf_dtype)
            env.update(zip((id(r) for r in op.results), res))
        return [env[id(v)] for v in outs]

    # -- shared helpers for op encodings ---------------------------------------------------
    def apply_uf(self, name: str, x: STensor) -> STensor:
        """x mapped elementwise through the uninterpreted function `name` (an opaque kernel)."""
        g = self.uf(name)
        return STensor(x.shape, lambda i: g(x.f(i)))

    def ite(self, c: Any, a: Any, b: Any) -> Any:
        return z3.If(c, a, b)

    def as_int(self, v: Any) -> Any:
        """An index value as a z3 Int (index tensors are encoded as Ints or Reals)."""
        if isinstance(v, int):
            return z3.IntVal(v)
        return v if z3.is_int(v) else z3.ToInt(v)

    def as_real(self, v: Any) -> Any:
        if isinstance(v, (int, float)):
            return z3.RealVal(v)
        if z3.is_bool(v):
            return z3.If(v, z3.RealVal(1), z3.RealVal(0))
        return z3.ToReal(v) if z3.is_int(v) else v

    def as_bool(self, v: Any) -> Any:
        return v if z3.is_bool(v) else v != 0

    def const(self, v: Any) -> STensor:
        c = self.as_real(v)
        return STensor((), lambda i: c)

    def transpose(self, x: STensor, perm: Sequence[int]) -> STensor:
        perm = [p % x.rank for p in perm]
        shape = tuple(x.shape[p] for p in perm)

        def f(idx: Idx) -> Any:
            src: list[Any] = [None] * x.rank
            for a, p in enumerate(perm):
                src[p] = idx[a]
            return x.f(tuple(src))

        return STensor(shape, f)

    def swap_last(self, x: STensor) -> STensor:
        return self.transpose(x, tuple(range(x.rank - 2)) + (x.rank - 1, x.rank - 2))

    def matmul(
        self, a: STensor, b: STensor, transpose_a: bool = False, transpose_b: bool = False
    ) -> STensor:
        if a.rank < 2 or b.rank < 2:
            raise EncodeError("matmul of vectors is not encoded")
        a = self.swap_last(a) if transpose_a else a
        b = self.swap_last(b) if transpose_b else b
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

    def reduce(
        self, x: STensor, axes: Sequence[int], keepdims: bool, kind: str, init: Any = None
    ) -> STensor:
        """Reduce over `axes` (all when empty): kind sum, mean, max, min, or any name (an
        uninterpreted reduction `<kind>R(n, λk. body)`, e.g. prod)."""
        axs = sorted({a % x.rank for a in axes} or set(range(x.rank)))
        shape = tuple(
            (1 if i in axs else d) for i, d in enumerate(x.shape) if keepdims or i not in axs
        )

        def f(idx: Idx) -> Any:
            full: list[Any] = []
            it = iter(idx)
            for i in range(x.rank):
                if i in axs:
                    if keepdims:
                        next(it)
                    full.append(None)
                else:
                    full.append(next(it))
            return self._nested(x, full, axs, kind)

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
        return self.reduction(kind, n, body)

    def reduction(self, kind: str, n: Any, body: Callable[[Any], Any], sort: Any = None) -> Any:
        """An uninterpreted reduction `kind` of the n values body(k) (max, min, prod, argmax...)."""
        if kind == "max":
            fn = self.max_fn
        elif kind == "min":
            fn = self.min_fn
        else:
            key = f"{kind}R"
            if key not in self.funcs:
                self.funcs[key] = z3.Function(
                    key, self.I, z3.ArraySort(self.I, self.R), sort if sort is not None else self.R
                )
            fn = self.funcs[key]
        k, e = self.bound(body)
        if z3.is_bool(e):
            e = z3.If(e, z3.RealVal(1), z3.RealVal(0))
        elif z3.is_int(e):
            e = z3.ToReal(e)
        return fn(n if not isinstance(n, int) else z3.IntVal(n), z3.Lambda([k], e))

    def softmax(self, x: STensor, axis: int) -> STensor:
        ax = axis % x.rank
        mx = self.reduce(x, (ax,), True, "max")
        e = STensor(x.shape, lambda i: self.exp(x.f(i) - mx.f(zero_at(i, ax))))
        s = self.reduce(e, (ax,), True, "sum")
        return STensor(x.shape, lambda i: e.f(i) / s.f(zero_at(i, ax)))

    def concat(self, args: Sequence[STensor], axis: int) -> STensor:
        ax = axis % args[0].rank
        total: Any = 0
        offs = []
        for t in args:
            offs.append(total)
            total = total + t.shape[ax]
        shape = tuple(total if i == ax else d for i, d in enumerate(args[0].shape))

        def f(idx: Idx) -> Any:
            out = args[-1].f(shift(idx, ax, -offs[-1]))
            for t, o in zip(reversed(args[:-1]), reversed(offs[:-1])):
                out = z3.If(idx[ax] < o + t.shape[ax], t.f(shift(idx, ax, -o)), out)
            return out

        return STensor(shape, f)

    def rms_norm(self, x: STensor, w: STensor, eps: Any, offset: Any) -> STensor:
        eps = z3.RealVal(eps) if isinstance(eps, float) else eps
        sq = STensor(x.shape, lambda i: x.f(i) * x.f(i))
        ms = self.reduce(sq, (-1,), True, "mean")
        last = x.rank - 1

        def f(i: Idx) -> Any:
            t = ms.f(zero_at(i, last)) + eps
            return x.f(i) * self.rsqrt(t) * (w.f((i[-1],)) + offset)

        return STensor(x.shape, f)

    def sigmoid(self, x: Any) -> Any:
        return self.uf("sigmoid")(x)

    def silu(self, x: Any) -> Any:
        return x * self.sigmoid(x)

    def gelu(self, x: STensor, approximate: str) -> STensor:
        return self.apply_uf(f"gelu_{approximate}", x)

    def activation(self, kind: str, y: STensor) -> STensor:
        """none, relu, silu, gelu (erf), gelu_tanh: the activations of fused projections."""
        if kind == "none":
            return y
        if kind in ("gelu", "gelu_tanh"):
            return self.gelu(y, "none" if kind == "gelu" else "tanh")
        return self.op(f"core.{kind}", [y], {})[0]


def zero_at(idx: Idx, ax: int) -> Idx:
    return tuple(0 if i == ax else v for i, v in enumerate(idx))


def shift(idx: Idx, ax: int, by: Any) -> Idx:
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


# kept for the encoders written before the helpers were public
_zero_at = zero_at
_shift = shift


# -- integer codes (quantized storage): rounding, bit fields ---------------------------------


def floor_int(t: Any) -> Any:
    """floor(t) as a z3 Int."""
    return z3.ToInt(t)


def round_half_away(t: Any) -> Any:
    """C's roundf: the nearest integer, halves away from zero (MLAS' quantizer), a z3 Int."""
    half = z3.RealVal(1) / 2
    return z3.If(t >= 0, z3.ToInt(t + half), -z3.ToInt(half - t))


def round_half_even(t: Any) -> Any:
    """numpy's rint: the nearest integer, halves to even, a z3 Int."""
    up = t + z3.RealVal(1) / 2
    r = z3.ToInt(up)
    tie = z3.ToReal(r) == up
    return z3.If(z3.And(tie, r % 2 == 1), r - 1, r)


def clamp_int(v: Any, lo: int, hi: int) -> Any:
    return z3.If(v < lo, z3.IntVal(lo), z3.If(v > hi, z3.IntVal(hi), v))


def bit_field(byte: Any, slot: Any, bits: int) -> Any:
    """Code `slot` of a byte holding 8/bits codes lowest bits first (4 bits: slot 0 is the low
    nibble, byte mod 16; slot 1 the high nibble, byte div 16), as integer arithmetic."""
    if bits == 8:
        return byte
    return _shift_down(byte, slot, bits) % (1 << bits)


def _shift_down(byte: Any, slot: Any, bits: int) -> Any:
    """byte div 2^(bits * slot) for a slot in [0, 8/bits) (a z3 Int or a Python int)."""
    if isinstance(slot, int):
        return byte / (1 << (bits * slot))
    out = byte
    for j in range(8 // bits - 1, 0, -1):
        out = z3.If(slot == j, byte / (1 << (bits * j)), out)
    return out
