"""Element-level SMT semantics for the ops the fusion and lifting rules introduce or match
(`llm.add_rms_norm`, `llm.linear`, `llm.layer_norm`, `llm.rotary_embedding`,
`llm.scaled_dot_product_attention`, and the shape ops of exported patterns: slice, unsqueeze,
gather, tile, reshape, constant_of_shape, trilu), and the encoder of `lhs == rhs` obligations
that uses them.

Like `llmir_core.smt.semantics`, which it extends, this module imports z3 at the top and is
imported only inside the solver child (the obligations in `llmir_core.rewrite.obligations` import
it lazily). Each fused op is encoded as its definition, built from the base encoder's ops, so a
pattern and its fused op meet as equal hash-consed terms wherever the rule is exact.

Two encoding choices keep both sides of a rule in one normal form:
- `a / b` is encoded as `a * (1 / b)` (equal over the reals for b != 0), so a scale written as a
  division and one written as a multiplication by the reciprocal meet;
- an additive mask of `-inf` and `0` entries (`trilu(constant_of_shape(-inf))`) is a
  `MaskTensor`: adding it to x gives `If(masked, NEG, x)`, IEEE's `x + -inf = -inf` for finite x,
  where NEG is one uninterpreted Real standing for -inf.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from llmir_core.smt.semantics import EncodeError, Encoder, STensor, _is_square, _zero_at

from .terms import BIG, A, C, K, T, Term, V, leaves

Idx = tuple[Any, ...]


@dataclass
class MaskTensor(STensor):
    """An additive mask whose elements are -inf where `cond(idx)` holds and 0 elsewhere."""

    cond: Callable[[Idx], Any] = lambda i: z3.BoolVal(False)


class ExtEncoder(Encoder):
    def __init__(self) -> None:
        super().__init__()
        self.neg_inf = z3.Real("NEG_INF")

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
        if name == "core.add" and any(isinstance(a, MaskTensor) for a in args):
            return [self._add_mask(args)]
        return super().op(name, args, attrs, leaf_dtype)

    def _add_mask(self, args: Sequence[STensor]) -> STensor:
        m = next(a for a in args if isinstance(a, MaskTensor))
        x = next((a for a in args if a is not m), None)
        if x is None or isinstance(x, MaskTensor):
            raise EncodeError("adding two masks is not encoded")
        shape, maps = self.broadcast(*args)
        mi = list(args).index(m)
        xi = 1 - mi
        return STensor(shape, lambda i: z3.If(m.cond(maps[mi](i)), self.neg_inf, x.f(maps[xi](i))))

    # -- shape ops of exported patterns ---------------------------------------------------
    def op_core_slice(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x = args[0]
        axes = attrs.get("axes") or tuple(range(len(attrs["starts"])))
        steps = attrs.get("steps") or (1,) * len(axes)
        shape = list(x.shape)
        starts = [0] * x.rank
        for ax, s0, e, st in zip(axes, attrs["starts"], attrs["ends"], steps):
            a = ax % x.rank
            if st != 1 or (isinstance(s0, int) and s0 < 0) or (isinstance(e, int) and e < 0):
                raise EncodeError("only slices with step 1 and non-negative bounds are encoded")
            end = x.shape[a] if isinstance(e, int) and e >= BIG else e
            shape[a] = end - s0
            starts[a] = s0

        def f(i: Idx) -> Any:
            return x.f(
                tuple(
                    v + s if not (isinstance(s, int) and s == 0) else v for v, s in zip(i, starts)
                )
            )

        return STensor(tuple(shape), f)

    def op_core_unsqueeze(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x = args[0]
        rank = x.rank + len(attrs["axes"])
        axes = sorted(a % rank for a in attrs["axes"])
        shape: list[Any] = list(x.shape)
        for a in axes:
            shape.insert(a, 1)
        return STensor(
            tuple(shape), lambda i: x.f(tuple(v for j, v in enumerate(i) if j not in axes))
        )

    def op_core_gather(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x, idx = args
        if attrs.get("axis", 0) % x.rank != 0:
            raise EncodeError("only gather along axis 0 is encoded")
        n = idx.rank

        def f(i: Idx) -> Any:
            j = idx.f(i[:n])
            j = j if z3.is_int(j) else z3.ToInt(j)
            return x.f((j,) + tuple(i[n:]))

        return STensor(tuple(idx.shape) + tuple(x.shape[1:]), f)

    def op_core_tile(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x = args[0]
        reps = attrs["repeats"]
        if any(
            not (isinstance(d, int) and d == 1) and not (isinstance(r, int) and r == 1)
            for d, r in zip(x.shape, reps)
        ):
            raise EncodeError("only tiling of size-1 dims is encoded")
        shape = tuple(r if isinstance(d, int) and d == 1 else d for d, r in zip(x.shape, reps))
        return STensor(
            shape,
            lambda i: x.f(
                tuple(0 if isinstance(d, int) and d == 1 else v for d, v in zip(x.shape, i))
            ),
        )

    def op_core_reshape(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        """Only merging two adjacent dims [.., a, b, ..] -> [.., a*b, ..] (the GQA repeat)."""
        x = args[0]
        at = attrs.get("__merge__")
        if at is None or x.rank < 2:
            raise EncodeError("only reshapes that merge two adjacent dims are encoded")
        inner = x.shape[at + 1]
        shape = tuple(x.shape[:at]) + (x.shape[at] * inner,) + tuple(x.shape[at + 2 :])

        def f(i: Idx) -> Any:
            h = i[at]
            return x.f(tuple(i[:at]) + (h / inner, h % inner) + tuple(i[at + 1 :]))

        return STensor(shape, f)

    def op_core_constant_of_shape(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        shape = attrs.get("__shape__")
        if shape is None or not attrs.get("__neg_inf__"):
            raise EncodeError("only a -inf fill of a known shape is encoded")
        return MaskTensor(tuple(shape), lambda i: self.neg_inf, lambda i: z3.BoolVal(True))

    def op_core_trilu(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x = args[0]
        if not isinstance(x, MaskTensor) or len(args) < 2 or x.rank != 2:
            raise EncodeError("only trilu of a -inf fill is encoded")
        k = z3.ToInt(args[1].f(())) if not z3.is_int(args[1].f(())) else args[1].f(())
        upper = attrs.get("upper", True)
        return MaskTensor(
            x.shape,
            x.f,
            lambda i: z3.And(x.cond(i), (i[1] - i[0] >= k) if upper else (i[1] - i[0] <= k)),
        )

    # -- fused and lifted llm ops: their definitions ------------------------------------------
    def op_llm_add_rms_norm(self, args: Sequence[STensor], attrs: dict[str, Any]) -> list[STensor]:
        x, r, w = args
        s = self.elementwise(lambda a, b: a + b, x, r)
        return [self.op_llm_rms_norm([s, w], attrs), s]

    def op_llm_linear(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        y = self.op_core_matmul(args[:2], {"transpose_b": attrs.get("transpose_b", True)})
        if len(args) > 2:
            y = self.elementwise(lambda a, b: a + b, y, args[2])
        act = attrs.get("activation", "none")
        if act == "none":
            return y
        if act in ("gelu", "gelu_tanh"):
            return self.op_core_gelu([y], {"approximate": "none" if act == "gelu" else "tanh"})
        return self.op(f"core.{act}", [y], {})[0]

    def op_llm_layer_norm(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x, w = args[0], args[1]
        eps = attrs.get("eps", 1e-5)
        eps = z3.RealVal(eps) if isinstance(eps, float) else eps
        mean = self._reduce(x, {"axes": (-1,), "keepdims": True}, "mean")
        c = self.elementwise(lambda a, b: a - b, x, mean)
        var = self._reduce(
            self.elementwise(lambda a, b: a * b, c, c), {"axes": (-1,), "keepdims": True}, "mean"
        )
        last = x.rank - 1
        y = STensor(x.shape, lambda i: c.f(i) * self.rsqrt(var.f(_zero_at(i, last)) + eps))
        y = self.elementwise(lambda a, b: a * b, y, w)
        if len(args) > 2:
            y = self.elementwise(lambda a, b: a + b, y, args[2])
        return y

    def op_llm_rotary_embedding(self, args: Sequence[STensor], attrs: dict[str, Any]) -> STensor:
        x, cos, sin, pos = args
        if attrs.get("interleaved") or attrs.get("rotary_dim", 0):
            raise EncodeError("only full, non-interleaved rotary embedding is encoded")
        half = cos.shape[1]

        def p(i: Idx) -> Any:
            v = pos.f((i[0], i[2]))
            return v if z3.is_int(v) else z3.ToInt(v)

        def f(i: Idx) -> Any:
            d = i[3]
            lo = i[:3] + (d + half,)
            hi = i[:3] + (d - half,)
            first = x.f(i) * cos.f((p(i), d)) - x.f(lo) * sin.f((p(i), d))
            second = x.f(i) * cos.f((p(i), d - half)) + x.f(hi) * sin.f((p(i), d - half))
            return z3.If(d < half, first, second)

        return STensor(x.shape, f)

    def op_llm_scaled_dot_product_attention(
        self, args: Sequence[STensor], attrs: dict[str, Any]
    ) -> STensor:
        q, k, v = args[:3]
        for key in ("softcap", "sliding_window", "softmax_eps"):
            if attrs.get(key):
                raise EncodeError(f"attention with {key} is not encoded")
        scale = attrs.get("scale", 0.0)
        if isinstance(scale, float):
            if scale == 0.0:
                raise EncodeError("attention with the default scale is not encoded")
            scale = z3.RealVal(scale)
        group = _quotient(q.shape[1], k.shape[1])
        if group is not None:  # grouped-query: kv head h // group serves q head h
            k = STensor(
                k.shape[:1] + q.shape[1:2] + k.shape[2:],
                (lambda t: lambda i: t.f((i[0], i[1] / group) + i[2:]))(k),
            )
            v = STensor(
                v.shape[:1] + q.shape[1:2] + v.shape[2:],
                (lambda t: lambda i: t.f((i[0], i[1] / group) + i[2:]))(v),
            )
        kt = self.op_core_transpose([k], {"perm": (0, 1, 3, 2)})
        s = self.op_core_matmul([q, kt], {})
        s = self.elementwise(lambda a, b: a * b, s, STensor((), lambda i: scale))
        if len(args) > 3:
            s = self.op("core.add", [s, args[3]], {})[0]
        if attrs.get("causal"):
            sq, skv = q.shape[2], k.shape[2]
            sc = s
            # masked iff key j > i + Skv - Sq (the same normal form as an additive trilu mask)
            s = STensor(
                sc.shape, lambda i: z3.If(i[3] - i[2] >= 1 + skv - sq, self.neg_inf, sc.f(i))
            )
        p = self.op_core_softmax([s], {"axis": -1})
        return self.op_core_matmul([p, v], {})


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


def _quotient(a: Any, b: Any) -> Any:
    """a / b for head counts (None when equal): ints, or a product of symbols with b a factor."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0 or a % b:
            raise EncodeError(f"{a} heads are not a multiple of {b}")
        return None if a == b else a // b
    if not isinstance(a, int) and not isinstance(b, int) and a.eq(b):
        return None
    if z3.is_mul(a):
        rest = [a.arg(i) for i in range(a.num_args())]
        for j, f in enumerate(rest):
            if not isinstance(b, int) and f.eq(b):
                others = rest[:j] + rest[j + 1 :]
                out = others[0]
                for o in others[1:]:
                    out = out * o
                return out
    raise EncodeError("cannot tell the grouped-query factor from the head counts")


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
        syms = {
            **{k: v for k, v in env.items() if not isinstance(v, STensor)},
            **dims,
            "__leaves__": env,
        }
        attrs = dict(proof_attrs(batch, syms)) if proof_attrs else {}
        syms.update({k: v for k, v in attrs.items() if isinstance(v, z3.ExprRef)})
        cache: dict[int, list[STensor]] = {}

        def resolve(
            v: Any, attrs: dict[str, Any] = attrs, syms: dict[str, Any] = syms, sfx: str = sfx
        ) -> Any:
            if isinstance(v, A):
                if v.name in attrs:
                    return attrs[v.name]
                if v.name not in syms:
                    syms[v.name] = z3.Real(v.name + sfx)
                return syms[v.name]
            if isinstance(v, (tuple, list)):
                return tuple(resolve(x) for x in v)
            return v

        def encode(
            term: Term,
            enc: ExtEncoder = enc,
            env: dict[str, Any] = env,
            cache: dict[int, list[STensor]] = cache,
            attrs: dict[str, Any] = attrs,
        ) -> STensor:
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
